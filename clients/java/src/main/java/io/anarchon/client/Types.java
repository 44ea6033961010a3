package io.anarchon.client;

final class Types {
  private Types() {}

  static String trim(String name, String prefix) {
    return name.startsWith(prefix) ? name.substring(prefix.length()) : name;
  }

  static Holder holder(io.anarchon.v1.Holder h) {
    return h == null || h.getNode().isEmpty() ? null : new Holder(h.getNode(), h.getInstance());
  }
}
