package io.anarchon.client;

import io.grpc.Status;

/**
 * A held run's lease was lost: stop working, the result is not yours to publish.
 * {@link #reason()} is the sidecar's ({@code fenced}, {@code unavailable}) or
 * {@code stream_broken} when the Hold stream to the sidecar broke.
 */
public final class LeaseLostException extends AnarchonException {
  public LeaseLostException(String reason) {
    super(Status.Code.ABORTED, reason, "lease lost (" + reason + ")", null);
  }
}
