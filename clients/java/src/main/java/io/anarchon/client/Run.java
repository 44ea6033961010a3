package io.anarchon.client;

/** One run of a job. {@code state}: RUNNING, SUCCEEDED, FAILED, INTERRUPTED, CLAIMED. */
public record Run(
    long slotMs,
    int attempt,
    String state,
    Holder holder,
    long claimedAtMs,
    long finishedAtMs,
    long leaseUntilMs,
    long fencing) {

  static Run of(io.anarchon.v1.Run r) {
    return new Run(r.getSlotMs(), r.getAttempt(), Types.trim(r.getState().name(), "RUN_STATE_"),
        r.hasHolder() ? Types.holder(r.getHolder()) : null, r.getClaimedAtMs(),
        r.getFinishedAtMs(), r.getLeaseUntilMs(), r.getFencing());
  }
}
