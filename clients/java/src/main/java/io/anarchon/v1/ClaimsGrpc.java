package io.anarchon.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 */
@javax.annotation.Generated(
    value = "by gRPC proto compiler",
    comments = "Source: anarchon/v1/claims.proto")
@io.grpc.stub.annotations.GrpcGenerated
public final class ClaimsGrpc {

  private ClaimsGrpc() {}

  public static final String SERVICE_NAME = "anarchon.v1.Claims";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.ClaimRequest,
      io.anarchon.v1.ClaimResponse> getClaimMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Claim",
      requestType = io.anarchon.v1.ClaimRequest.class,
      responseType = io.anarchon.v1.ClaimResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.ClaimRequest,
      io.anarchon.v1.ClaimResponse> getClaimMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.ClaimRequest, io.anarchon.v1.ClaimResponse> getClaimMethod;
    if ((getClaimMethod = ClaimsGrpc.getClaimMethod) == null) {
      synchronized (ClaimsGrpc.class) {
        if ((getClaimMethod = ClaimsGrpc.getClaimMethod) == null) {
          ClaimsGrpc.getClaimMethod = getClaimMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.ClaimRequest, io.anarchon.v1.ClaimResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Claim"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ClaimRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ClaimResponse.getDefaultInstance()))
              .setSchemaDescriptor(new ClaimsMethodDescriptorSupplier("Claim"))
              .build();
        }
      }
    }
    return getClaimMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.RenewRequest,
      io.anarchon.v1.RenewResponse> getRenewMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Renew",
      requestType = io.anarchon.v1.RenewRequest.class,
      responseType = io.anarchon.v1.RenewResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.RenewRequest,
      io.anarchon.v1.RenewResponse> getRenewMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.RenewRequest, io.anarchon.v1.RenewResponse> getRenewMethod;
    if ((getRenewMethod = ClaimsGrpc.getRenewMethod) == null) {
      synchronized (ClaimsGrpc.class) {
        if ((getRenewMethod = ClaimsGrpc.getRenewMethod) == null) {
          ClaimsGrpc.getRenewMethod = getRenewMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.RenewRequest, io.anarchon.v1.RenewResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Renew"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.RenewRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.RenewResponse.getDefaultInstance()))
              .setSchemaDescriptor(new ClaimsMethodDescriptorSupplier("Renew"))
              .build();
        }
      }
    }
    return getRenewMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.ReleaseRequest,
      io.anarchon.v1.ReleaseResponse> getReleaseMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Release",
      requestType = io.anarchon.v1.ReleaseRequest.class,
      responseType = io.anarchon.v1.ReleaseResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.ReleaseRequest,
      io.anarchon.v1.ReleaseResponse> getReleaseMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.ReleaseRequest, io.anarchon.v1.ReleaseResponse> getReleaseMethod;
    if ((getReleaseMethod = ClaimsGrpc.getReleaseMethod) == null) {
      synchronized (ClaimsGrpc.class) {
        if ((getReleaseMethod = ClaimsGrpc.getReleaseMethod) == null) {
          ClaimsGrpc.getReleaseMethod = getReleaseMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.ReleaseRequest, io.anarchon.v1.ReleaseResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Release"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ReleaseRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ReleaseResponse.getDefaultInstance()))
              .setSchemaDescriptor(new ClaimsMethodDescriptorSupplier("Release"))
              .build();
        }
      }
    }
    return getReleaseMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.ClaimRequest,
      io.anarchon.v1.HoldEvent> getHoldMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Hold",
      requestType = io.anarchon.v1.ClaimRequest.class,
      responseType = io.anarchon.v1.HoldEvent.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.ClaimRequest,
      io.anarchon.v1.HoldEvent> getHoldMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.ClaimRequest, io.anarchon.v1.HoldEvent> getHoldMethod;
    if ((getHoldMethod = ClaimsGrpc.getHoldMethod) == null) {
      synchronized (ClaimsGrpc.class) {
        if ((getHoldMethod = ClaimsGrpc.getHoldMethod) == null) {
          ClaimsGrpc.getHoldMethod = getHoldMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.ClaimRequest, io.anarchon.v1.HoldEvent>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Hold"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ClaimRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.HoldEvent.getDefaultInstance()))
              .setSchemaDescriptor(new ClaimsMethodDescriptorSupplier("Hold"))
              .build();
        }
      }
    }
    return getHoldMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.HistoryRequest,
      io.anarchon.v1.HistoryResponse> getHistoryMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "History",
      requestType = io.anarchon.v1.HistoryRequest.class,
      responseType = io.anarchon.v1.HistoryResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.HistoryRequest,
      io.anarchon.v1.HistoryResponse> getHistoryMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.HistoryRequest, io.anarchon.v1.HistoryResponse> getHistoryMethod;
    if ((getHistoryMethod = ClaimsGrpc.getHistoryMethod) == null) {
      synchronized (ClaimsGrpc.class) {
        if ((getHistoryMethod = ClaimsGrpc.getHistoryMethod) == null) {
          ClaimsGrpc.getHistoryMethod = getHistoryMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.HistoryRequest, io.anarchon.v1.HistoryResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "History"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.HistoryRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.HistoryResponse.getDefaultInstance()))
              .setSchemaDescriptor(new ClaimsMethodDescriptorSupplier("History"))
              .build();
        }
      }
    }
    return getHistoryMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static ClaimsStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<ClaimsStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<ClaimsStub>() {
        @java.lang.Override
        public ClaimsStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new ClaimsStub(channel, callOptions);
        }
      };
    return ClaimsStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static ClaimsBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<ClaimsBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<ClaimsBlockingStub>() {
        @java.lang.Override
        public ClaimsBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new ClaimsBlockingStub(channel, callOptions);
        }
      };
    return ClaimsBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static ClaimsFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<ClaimsFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<ClaimsFutureStub>() {
        @java.lang.Override
        public ClaimsFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new ClaimsFutureStub(channel, callOptions);
        }
      };
    return ClaimsFutureStub.newStub(factory, channel);
  }

  /**
   */
  public static abstract class ClaimsImplBase implements io.grpc.BindableService {

    /**
     * <pre>
     * Decide, in one atomic step inside the store, who owns (job, slot).
     * </pre>
     */
    public void claim(io.anarchon.v1.ClaimRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.ClaimResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getClaimMethod(), responseObserver);
    }

    /**
     * <pre>
     * Extend the lease of a run the caller holds (lease backends only).
     * </pre>
     */
    public void renew(io.anarchon.v1.RenewRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.RenewResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getRenewMethod(), responseObserver);
    }

    /**
     * <pre>
     * Mark a held run finished. Idempotent for the same token.
     * </pre>
     */
    public void release(io.anarchon.v1.ReleaseRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.ReleaseResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getReleaseMethod(), responseObserver);
    }

    /**
     * <pre>
     * Claim, then keep renewing while the stream is open. The first event
     * carries the ClaimResponse. A stream that breaks without a Release ends
     * the lease at once, so the next claimer takes the run over.
     * </pre>
     */
    public void hold(io.anarchon.v1.ClaimRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.HoldEvent> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getHoldMethod(), responseObserver);
    }

    /**
     * <pre>
     * Runs of a job, newest slot first.
     * </pre>
     */
    public void history(io.anarchon.v1.HistoryRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.HistoryResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getHistoryMethod(), responseObserver);
    }

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
          .addMethod(
            getClaimMethod(),
            io.grpc.stub.ServerCalls.asyncUnaryCall(
              new MethodHandlers<
                io.anarchon.v1.ClaimRequest,
                io.anarchon.v1.ClaimResponse>(
                  this, METHODID_CLAIM)))
          .addMethod(
            getRenewMethod(),
            io.grpc.stub.ServerCalls.asyncUnaryCall(
              new MethodHandlers<
                io.anarchon.v1.RenewRequest,
                io.anarchon.v1.RenewResponse>(
                  this, METHODID_RENEW)))
          .addMethod(
            getReleaseMethod(),
            io.grpc.stub.ServerCalls.asyncUnaryCall(
              new MethodHandlers<
                io.anarchon.v1.ReleaseRequest,
                io.anarchon.v1.ReleaseResponse>(
                  this, METHODID_RELEASE)))
          .addMethod(
            getHoldMethod(),
            io.grpc.stub.ServerCalls.asyncServerStreamingCall(
              new MethodHandlers<
                io.anarchon.v1.ClaimRequest,
                io.anarchon.v1.HoldEvent>(
                  this, METHODID_HOLD)))
          .addMethod(
            getHistoryMethod(),
            io.grpc.stub.ServerCalls.asyncUnaryCall(
              new MethodHandlers<
                io.anarchon.v1.HistoryRequest,
                io.anarchon.v1.HistoryResponse>(
                  this, METHODID_HISTORY)))
          .build();
    }
  }

  /**
   */
  public static final class ClaimsStub extends io.grpc.stub.AbstractAsyncStub<ClaimsStub> {
    private ClaimsStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected ClaimsStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new ClaimsStub(channel, callOptions);
    }

    /**
     * <pre>
     * Decide, in one atomic step inside the store, who owns (job, slot).
     * </pre>
     */
    public void claim(io.anarchon.v1.ClaimRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.ClaimResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getClaimMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Extend the lease of a run the caller holds (lease backends only).
     * </pre>
     */
    public void renew(io.anarchon.v1.RenewRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.RenewResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getRenewMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Mark a held run finished. Idempotent for the same token.
     * </pre>
     */
    public void release(io.anarchon.v1.ReleaseRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.ReleaseResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getReleaseMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Claim, then keep renewing while the stream is open. The first event
     * carries the ClaimResponse. A stream that breaks without a Release ends
     * the lease at once, so the next claimer takes the run over.
     * </pre>
     */
    public void hold(io.anarchon.v1.ClaimRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.HoldEvent> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getHoldMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Runs of a job, newest slot first.
     * </pre>
     */
    public void history(io.anarchon.v1.HistoryRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.HistoryResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getHistoryMethod(), getCallOptions()), request, responseObserver);
    }
  }

  /**
   */
  public static final class ClaimsBlockingStub extends io.grpc.stub.AbstractBlockingStub<ClaimsBlockingStub> {
    private ClaimsBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected ClaimsBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new ClaimsBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * Decide, in one atomic step inside the store, who owns (job, slot).
     * </pre>
     */
    public io.anarchon.v1.ClaimResponse claim(io.anarchon.v1.ClaimRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getClaimMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Extend the lease of a run the caller holds (lease backends only).
     * </pre>
     */
    public io.anarchon.v1.RenewResponse renew(io.anarchon.v1.RenewRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getRenewMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Mark a held run finished. Idempotent for the same token.
     * </pre>
     */
    public io.anarchon.v1.ReleaseResponse release(io.anarchon.v1.ReleaseRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getReleaseMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Claim, then keep renewing while the stream is open. The first event
     * carries the ClaimResponse. A stream that breaks without a Release ends
     * the lease at once, so the next claimer takes the run over.
     * </pre>
     */
    public java.util.Iterator<io.anarchon.v1.HoldEvent> hold(
        io.anarchon.v1.ClaimRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getHoldMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Runs of a job, newest slot first.
     * </pre>
     */
    public io.anarchon.v1.HistoryResponse history(io.anarchon.v1.HistoryRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getHistoryMethod(), getCallOptions(), request);
    }
  }

  /**
   */
  public static final class ClaimsFutureStub extends io.grpc.stub.AbstractFutureStub<ClaimsFutureStub> {
    private ClaimsFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected ClaimsFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new ClaimsFutureStub(channel, callOptions);
    }

    /**
     * <pre>
     * Decide, in one atomic step inside the store, who owns (job, slot).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.anarchon.v1.ClaimResponse> claim(
        io.anarchon.v1.ClaimRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getClaimMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Extend the lease of a run the caller holds (lease backends only).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.anarchon.v1.RenewResponse> renew(
        io.anarchon.v1.RenewRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getRenewMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Mark a held run finished. Idempotent for the same token.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.anarchon.v1.ReleaseResponse> release(
        io.anarchon.v1.ReleaseRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getReleaseMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Runs of a job, newest slot first.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<io.anarchon.v1.HistoryResponse> history(
        io.anarchon.v1.HistoryRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getHistoryMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_CLAIM = 0;
  private static final int METHODID_RENEW = 1;
  private static final int METHODID_RELEASE = 2;
  private static final int METHODID_HOLD = 3;
  private static final int METHODID_HISTORY = 4;

  private static final class MethodHandlers<Req, Resp> implements
      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {
    private final ClaimsImplBase serviceImpl;
    private final int methodId;

    MethodHandlers(ClaimsImplBase serviceImpl, int methodId) {
      this.serviceImpl = serviceImpl;
      this.methodId = methodId;
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_CLAIM:
          serviceImpl.claim((io.anarchon.v1.ClaimRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.ClaimResponse>) responseObserver);
          break;
        case METHODID_RENEW:
          serviceImpl.renew((io.anarchon.v1.RenewRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.RenewResponse>) responseObserver);
          break;
        case METHODID_RELEASE:
          serviceImpl.release((io.anarchon.v1.ReleaseRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.ReleaseResponse>) responseObserver);
          break;
        case METHODID_HOLD:
          serviceImpl.hold((io.anarchon.v1.ClaimRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.HoldEvent>) responseObserver);
          break;
        case METHODID_HISTORY:
          serviceImpl.history((io.anarchon.v1.HistoryRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.HistoryResponse>) responseObserver);
          break;
        default:
          throw new AssertionError();
      }
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public io.grpc.stub.StreamObserver<Req> invoke(
        io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        default:
          throw new AssertionError();
      }
    }
  }

  private static abstract class ClaimsBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    ClaimsBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return io.anarchon.v1.ClaimsOuterClass.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("Claims");
    }
  }

  private static final class ClaimsFileDescriptorSupplier
      extends ClaimsBaseDescriptorSupplier {
    ClaimsFileDescriptorSupplier() {}
  }

  private static final class ClaimsMethodDescriptorSupplier
      extends ClaimsBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final String methodName;

    ClaimsMethodDescriptorSupplier(String methodName) {
      this.methodName = methodName;
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.MethodDescriptor getMethodDescriptor() {
      return getServiceDescriptor().findMethodByName(methodName);
    }
  }

  private static volatile io.grpc.ServiceDescriptor serviceDescriptor;

  public static io.grpc.ServiceDescriptor getServiceDescriptor() {
    io.grpc.ServiceDescriptor result = serviceDescriptor;
    if (result == null) {
      synchronized (ClaimsGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new ClaimsFileDescriptorSupplier())
              .addMethod(getClaimMethod())
              .addMethod(getRenewMethod())
              .addMethod(getReleaseMethod())
              .addMethod(getHoldMethod())
              .addMethod(getHistoryMethod())
              .build();
        }
      }
    }
    return result;
  }
}
