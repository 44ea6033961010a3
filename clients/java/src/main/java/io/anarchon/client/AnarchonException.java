package io.anarchon.client;

import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;

/**
 * An error answered by the sidecar. Contention is never an exception: it is a
 * {@link Claim#outcome()}. {@link #reason()} is the machine-readable reason from
 * the {@code anarchon-reason} response metadata ({@code fenced}, {@code no_leases},
 * or the offending field for bad input), or null.
 */
public class AnarchonException extends RuntimeException {
  /** The response metadata key carrying the machine-readable reason. */
  public static final String REASON_KEY = "anarchon-reason";

  static final Metadata.Key<String> REASON =
      Metadata.Key.of(REASON_KEY, Metadata.ASCII_STRING_MARSHALLER);

  private final Status.Code code;
  private final String reason;

  public AnarchonException(Status.Code code, String reason, String message, Throwable cause) {
    super(message, cause);
    this.code = code;
    this.reason = reason;
  }

  /** The gRPC status code. */
  public Status.Code code() {
    return code;
  }

  /** The sidecar's machine-readable reason, or null. */
  public String reason() {
    return reason;
  }

  /** The token no longer holds its run (taken over, finished, holder restarted). */
  public static final class Fenced extends AnarchonException {
    Fenced(Status.Code c, String r, String m, Throwable t) {
      super(c, r, m, t);
    }
  }

  /** The backend has no leases (once backends). */
  public static final class NoLeases extends AnarchonException {
    NoLeases(Status.Code c, String r, String m, Throwable t) {
      super(c, r, m, t);
    }
  }

  /** Bad input; {@link #reason()} names the field. */
  public static final class InvalidArgument extends AnarchonException {
    InvalidArgument(Status.Code c, String r, String m, Throwable t) {
      super(c, r, m, t);
    }
  }

  /** No such run. */
  public static final class NotFound extends AnarchonException {
    NotFound(Status.Code c, String r, String m, Throwable t) {
      super(c, r, m, t);
    }
  }

  /** The sidecar or its store cannot be reached. */
  public static final class Unavailable extends AnarchonException {
    Unavailable(Status.Code c, String r, String m, Throwable t) {
      super(c, r, m, t);
    }
  }

  /** Missing or wrong bearer token (or not allowed). */
  public static final class Unauthenticated extends AnarchonException {
    Unauthenticated(Status.Code c, String r, String m, Throwable t) {
      super(c, r, m, t);
    }
  }

  /** Maps a gRPC failure to the matching exception. */
  static AnarchonException from(Throwable t) {
    if (t instanceof AnarchonException) {
      return (AnarchonException) t;
    }
    Status status = Status.fromThrowable(t);
    Metadata trailers = Status.trailersFromThrowable(t);
    String reason = trailers == null ? null : trailers.get(REASON);
    String details = status.getDescription() == null ? "" : status.getDescription();
    Status.Code code = status.getCode();
    if (reason == null && code == Status.Code.FAILED_PRECONDITION) {
      String first = details.split(":", 2)[0].trim();
      if (first.equals("fenced") || first.equals("no_leases")) {
        reason = first;
      }
    }
    String msg = code + (reason != null ? " (" + reason + ")" : "") + ": " + details;
    switch (code) {
      case FAILED_PRECONDITION:
        if ("fenced".equals(reason)) {
          return new Fenced(code, reason, msg, t);
        }
        if ("no_leases".equals(reason)) {
          return new NoLeases(code, reason, msg, t);
        }
        return new AnarchonException(code, reason, msg, t);
      case INVALID_ARGUMENT:
        return new InvalidArgument(code, reason, msg, t);
      case NOT_FOUND:
        return new NotFound(code, reason, msg, t);
      case UNAVAILABLE:
        return new Unavailable(code, reason, msg, t);
      case UNAUTHENTICATED:
      case PERMISSION_DENIED:
        return new Unauthenticated(code, reason, msg, t);
      default:
        return new AnarchonException(code, reason, msg, t);
    }
  }
}
