package io.anarchon.client;

import java.util.Map;

/**
 * A runtime as seen by the sidecar. {@code state}: ALIVE, UNREACHABLE, EXPIRED, LEFT;
 * {@code link}: DIRECT, RELAYED, NONE (UNSPECIFIED for the sidecar itself).
 */
public record Peer(
    String node,
    long instance,
    int restarts,
    String address,
    String state,
    String link,
    long beat,
    long beatAgeMs,
    Map<String, String> labels,
    String nodeName) {

  static Peer of(io.anarchon.v1.Peer p) {
    return new Peer(p.getNode(), p.getInstance(), p.getRestarts(), p.getAddress(),
        Types.trim(p.getState().name(), "PEER_STATE_"), Types.trim(p.getLink().name(), "LINK_"),
        p.getBeat(), p.getBeatAgeMs(), Map.copyOf(p.getLabelsMap()), p.getNodeName());
  }
}
