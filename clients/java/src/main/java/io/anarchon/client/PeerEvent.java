package io.anarchon.client;

/** {@code kind}: SNAPSHOT, JOINED, ALIVE, UNREACHABLE, EXPIRED, RESTARTED, LEFT. */
public record PeerEvent(String kind, Peer peer) {
  static PeerEvent of(io.anarchon.v1.PeerEvent e) {
    return new PeerEvent(Types.trim(e.getKind().name(), "PEER_EVENT_KIND_"), Peer.of(e.getPeer()));
  }
}
