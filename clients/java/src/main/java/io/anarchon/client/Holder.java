package io.anarchon.client;

/** The runtime that holds a run: a stable node id and the process generation. */
public record Holder(String node, long instance) {}
