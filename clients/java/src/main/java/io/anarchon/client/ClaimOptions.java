package io.anarchon.client;

import io.anarchon.v1.ClaimRequest;
import io.anarchon.v1.Overlap;
import java.time.Duration;

/** Optional fields of a claim; zero values take the sidecar's defaults. Immutable. */
public final class ClaimOptions {
  private final long leaseMs;
  private final long maxLateMs;
  private final Overlap overlap;
  private final int maxAttempts;
  private final long waitMs;
  private final String token;

  private ClaimOptions(long leaseMs, long maxLateMs, Overlap overlap, int maxAttempts, long waitMs, String token) {
    this.leaseMs = leaseMs;
    this.maxLateMs = maxLateMs;
    this.overlap = overlap;
    this.maxAttempts = maxAttempts;
    this.waitMs = waitMs;
    this.token = token;
  }

  /** Every field at the sidecar's default. */
  public static ClaimOptions defaults() {
    return new ClaimOptions(0, 0, Overlap.OVERLAP_UNSPECIFIED, 0, 0, "");
  }

  /** The lease length. */
  public ClaimOptions lease(Duration d) {
    return new ClaimOptions(d.toMillis(), maxLateMs, overlap, maxAttempts, waitMs, token);
  }

  /** How late after the slot a run may still be started. */
  public ClaimOptions maxLate(Duration d) {
    return new ClaimOptions(leaseMs, d.toMillis(), overlap, maxAttempts, waitMs, token);
  }

  /** Do not start a run while another run of the job is running. */
  public ClaimOptions overlapSkip() {
    return new ClaimOptions(leaseMs, maxLateMs, Overlap.OVERLAP_SKIP, maxAttempts, waitMs, token);
  }

  /** Runs of different slots may overlap. */
  public ClaimOptions overlapAllow() {
    return new ClaimOptions(leaseMs, maxLateMs, Overlap.OVERLAP_ALLOW, maxAttempts, waitMs, token);
  }

  /** Attempts allowed before the run is INTERRUPTED. */
  public ClaimOptions maxAttempts(int n) {
    return new ClaimOptions(leaseMs, maxLateMs, overlap, n, waitMs, token);
  }

  /** Block (lease backends) until the run can be won or this much time has passed. */
  public ClaimOptions waitFor(Duration d) {
    return new ClaimOptions(leaseMs, maxLateMs, overlap, maxAttempts, d.toMillis(), token);
  }

  /** Resend a claim with this token (32 hex) whose answer was lost. */
  public ClaimOptions token(String t) {
    return new ClaimOptions(leaseMs, maxLateMs, overlap, maxAttempts, waitMs, t);
  }

  long waitMs() {
    return waitMs;
  }

  ClaimRequest request(String job, long slotMs) {
    return ClaimRequest.newBuilder()
        .setJob(job)
        .setSlotMs(slotMs)
        .setToken(token)
        .setLeaseMs(leaseMs)
        .setMaxLateMs(maxLateMs)
        .setOverlap(overlap)
        .setMaxAttempts(maxAttempts)
        .setWaitMs(waitMs)
        .build();
  }
}
