package io.anarchon.client;

/** The outcome of a claim. Contention is an outcome, never an exception. */
public enum Outcome {
  /** The caller holds the run. */
  WON,
  /** Once backends: someone else's claim was stored first. */
  LOST,
  /** Another live holder has a current lease. */
  RUNNING,
  /** The run finished (reason: succeeded, failed, interrupted). */
  DONE,
  /** Too late to start this slot; nothing written. */
  LATE,
  /** overlap = SKIP and another run of the job is running. */
  OVERLAP,
  /** A value this client does not know. */
  UNKNOWN;

  static Outcome of(io.anarchon.v1.Outcome o) {
    switch (o) {
      case OUTCOME_WON:
        return WON;
      case OUTCOME_LOST:
        return LOST;
      case OUTCOME_RUNNING:
        return RUNNING;
      case OUTCOME_DONE:
        return DONE;
      case OUTCOME_LATE:
        return LATE;
      case OUTCOME_OVERLAP:
        return OVERLAP;
      default:
        return UNKNOWN;
    }
  }
}
