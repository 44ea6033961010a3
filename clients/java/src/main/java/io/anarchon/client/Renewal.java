package io.anarchon.client;

/** The answer to a renew. */
public record Renewal(long leaseUntilMs, int attempt, long validForMs, long fencing, long deadlineNanos) {}
