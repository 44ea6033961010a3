package io.anarchon.client;

import java.util.List;

/** A snapshot of the mesh: the sidecar's own runtime and every peer it knows. */
public record Peers(Peer self, List<Peer> peers) {}
