package io.anarchon.client;

import io.anarchon.v1.ClaimResponse;

/**
 * The answer to a claim. Only a won claim has a token. {@code deadlineNanos} is a
 * safe local deadline on the {@link System#nanoTime()} scale: the moment the
 * request was sent plus {@code validForMs}.
 */
public record Claim(
    String job,
    long slotMs,
    Outcome outcome,
    String token,
    int attempt,
    long fencing,
    long leaseUntilMs,
    long validForMs,
    Holder holder,
    String backend,
    String reason,
    long nowMs,
    long deadlineNanos) {

  /** Whether the caller holds the run. */
  public boolean won() {
    return outcome == Outcome.WON;
  }

  /** Whether the safe local deadline has passed. */
  public boolean expired() {
    return System.nanoTime() - deadlineNanos > 0;
  }

  static Claim of(String job, long slotMs, ClaimResponse r, long sentNanos) {
    return new Claim(job, slotMs, Outcome.of(r.getOutcome()), r.getToken(), r.getAttempt(),
        r.getFencing(), r.getLeaseUntilMs(), r.getValidForMs(),
        r.hasHolder() ? Types.holder(r.getHolder()) : null, r.getBackend(), r.getReason(),
        r.getNowMs(), sentNanos + r.getValidForMs() * 1_000_000L);
  }

  Claim withLease(long leaseUntilMs, long validForMs, long deadlineNanos) {
    return new Claim(job, slotMs, outcome, token, attempt, fencing, leaseUntilMs, validForMs,
        holder, backend, reason, nowMs, deadlineNanos);
  }
}
