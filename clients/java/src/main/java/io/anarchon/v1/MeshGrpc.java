package io.anarchon.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 */
@javax.annotation.Generated(
    value = "by gRPC proto compiler",
    comments = "Source: anarchon/v1/mesh.proto")
@io.grpc.stub.annotations.GrpcGenerated
public final class MeshGrpc {

  private MeshGrpc() {}

  public static final String SERVICE_NAME = "anarchon.v1.Mesh";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.WatchPeersRequest,
      io.anarchon.v1.PeerEvent> getWatchPeersMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "WatchPeers",
      requestType = io.anarchon.v1.WatchPeersRequest.class,
      responseType = io.anarchon.v1.PeerEvent.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.WatchPeersRequest,
      io.anarchon.v1.PeerEvent> getWatchPeersMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.WatchPeersRequest, io.anarchon.v1.PeerEvent> getWatchPeersMethod;
    if ((getWatchPeersMethod = MeshGrpc.getWatchPeersMethod) == null) {
      synchronized (MeshGrpc.class) {
        if ((getWatchPeersMethod = MeshGrpc.getWatchPeersMethod) == null) {
          MeshGrpc.getWatchPeersMethod = getWatchPeersMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.WatchPeersRequest, io.anarchon.v1.PeerEvent>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "WatchPeers"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.WatchPeersRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.PeerEvent.getDefaultInstance()))
              .setSchemaDescriptor(new MeshMethodDescriptorSupplier("WatchPeers"))
              .build();
        }
      }
    }
    return getWatchPeersMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.ListPeersRequest,
      io.anarchon.v1.ListPeersResponse> getListPeersMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "ListPeers",
      requestType = io.anarchon.v1.ListPeersRequest.class,
      responseType = io.anarchon.v1.ListPeersResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.ListPeersRequest,
      io.anarchon.v1.ListPeersResponse> getListPeersMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.ListPeersRequest, io.anarchon.v1.ListPeersResponse> getListPeersMethod;
    if ((getListPeersMethod = MeshGrpc.getListPeersMethod) == null) {
      synchronized (MeshGrpc.class) {
        if ((getListPeersMethod = MeshGrpc.getListPeersMethod) == null) {
          MeshGrpc.getListPeersMethod = getListPeersMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.ListPeersRequest, io.anarchon.v1.ListPeersResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "ListPeers"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ListPeersRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.ListPeersResponse.getDefaultInstance()))
              .setSchemaDescriptor(new MeshMethodDescriptorSupplier("ListPeers"))
              .build();
        }
      }
    }
    return getListPeersMethod;
  }

  private static volatile io.grpc.MethodDescriptor<io.anarchon.v1.SyncFrame,
      io.anarchon.v1.SyncFrame> getSyncMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Sync",
      requestType = io.anarchon.v1.SyncFrame.class,
      responseType = io.anarchon.v1.SyncFrame.class,
      methodType = io.grpc.MethodDescriptor.MethodType.BIDI_STREAMING)
  public static io.grpc.MethodDescriptor<io.anarchon.v1.SyncFrame,
      io.anarchon.v1.SyncFrame> getSyncMethod() {
    io.grpc.MethodDescriptor<io.anarchon.v1.SyncFrame, io.anarchon.v1.SyncFrame> getSyncMethod;
    if ((getSyncMethod = MeshGrpc.getSyncMethod) == null) {
      synchronized (MeshGrpc.class) {
        if ((getSyncMethod = MeshGrpc.getSyncMethod) == null) {
          MeshGrpc.getSyncMethod = getSyncMethod =
              io.grpc.MethodDescriptor.<io.anarchon.v1.SyncFrame, io.anarchon.v1.SyncFrame>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.BIDI_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Sync"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.SyncFrame.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  io.anarchon.v1.SyncFrame.getDefaultInstance()))
              .setSchemaDescriptor(new MeshMethodDescriptorSupplier("Sync"))
              .build();
        }
      }
    }
    return getSyncMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static MeshStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<MeshStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<MeshStub>() {
        @java.lang.Override
        public MeshStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new MeshStub(channel, callOptions);
        }
      };
    return MeshStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static MeshBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<MeshBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<MeshBlockingStub>() {
        @java.lang.Override
        public MeshBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new MeshBlockingStub(channel, callOptions);
        }
      };
    return MeshBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static MeshFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<MeshFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<MeshFutureStub>() {
        @java.lang.Override
        public MeshFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new MeshFutureStub(channel, callOptions);
        }
      };
    return MeshFutureStub.newStub(factory, channel);
  }

  /**
   */
  public static abstract class MeshImplBase implements io.grpc.BindableService {

    /**
     * <pre>
     * One SNAPSHOT per known runtime, then one event per change.
     * </pre>
     */
    public void watchPeers(io.anarchon.v1.WatchPeersRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.PeerEvent> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getWatchPeersMethod(), responseObserver);
    }

    /**
     */
    public void listPeers(io.anarchon.v1.ListPeersRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.ListPeersResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getListPeersMethod(), responseObserver);
    }

    /**
     * <pre>
     * The peer-to-peer heartbeat link. Not for applications.
     * </pre>
     */
    public io.grpc.stub.StreamObserver<io.anarchon.v1.SyncFrame> sync(
        io.grpc.stub.StreamObserver<io.anarchon.v1.SyncFrame> responseObserver) {
      return io.grpc.stub.ServerCalls.asyncUnimplementedStreamingCall(getSyncMethod(), responseObserver);
    }

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
          .addMethod(
            getWatchPeersMethod(),
            io.grpc.stub.ServerCalls.asyncServerStreamingCall(
              new MethodHandlers<
                io.anarchon.v1.WatchPeersRequest,
                io.anarchon.v1.PeerEvent>(
                  this, METHODID_WATCH_PEERS)))
          .addMethod(
            getListPeersMethod(),
            io.grpc.stub.ServerCalls.asyncUnaryCall(
              new MethodHandlers<
                io.anarchon.v1.ListPeersRequest,
                io.anarchon.v1.ListPeersResponse>(
                  this, METHODID_LIST_PEERS)))
          .addMethod(
            getSyncMethod(),
            io.grpc.stub.ServerCalls.asyncBidiStreamingCall(
              new MethodHandlers<
                io.anarchon.v1.SyncFrame,
                io.anarchon.v1.SyncFrame>(
                  this, METHODID_SYNC)))
          .build();
    }
  }

  /**
   */
  public static final class MeshStub extends io.grpc.stub.AbstractAsyncStub<MeshStub> {
    private MeshStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected MeshStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new MeshStub(channel, callOptions);
    }

    /**
     * <pre>
     * One SNAPSHOT per known runtime, then one event per change.
     * </pre>
     */
    public void watchPeers(io.anarchon.v1.WatchPeersRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.PeerEvent> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getWatchPeersMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     */
    public void listPeers(io.anarchon.v1.ListPeersRequest request,
        io.grpc.stub.StreamObserver<io.anarchon.v1.ListPeersResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getListPeersMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * The peer-to-peer heartbeat link. Not for applications.
     * </pre>
     */
    public io.grpc.stub.StreamObserver<io.anarchon.v1.SyncFrame> sync(
        io.grpc.stub.StreamObserver<io.anarchon.v1.SyncFrame> responseObserver) {
      return io.grpc.stub.ClientCalls.asyncBidiStreamingCall(
          getChannel().newCall(getSyncMethod(), getCallOptions()), responseObserver);
    }
  }

  /**
   */
  public static final class MeshBlockingStub extends io.grpc.stub.AbstractBlockingStub<MeshBlockingStub> {
    private MeshBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected MeshBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new MeshBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * One SNAPSHOT per known runtime, then one event per change.
     * </pre>
     */
    public java.util.Iterator<io.anarchon.v1.PeerEvent> watchPeers(
        io.anarchon.v1.WatchPeersRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getWatchPeersMethod(), getCallOptions(), request);
    }

    /**
     */
    public io.anarchon.v1.ListPeersResponse listPeers(io.anarchon.v1.ListPeersRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getListPeersMethod(), getCallOptions(), request);
    }
  }

  /**
   */
  public static final class MeshFutureStub extends io.grpc.stub.AbstractFutureStub<MeshFutureStub> {
    private MeshFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected MeshFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new MeshFutureStub(channel, callOptions);
    }

    /**
     */
    public com.google.common.util.concurrent.ListenableFuture<io.anarchon.v1.ListPeersResponse> listPeers(
        io.anarchon.v1.ListPeersRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getListPeersMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_WATCH_PEERS = 0;
  private static final int METHODID_LIST_PEERS = 1;
  private static final int METHODID_SYNC = 2;

  private static final class MethodHandlers<Req, Resp> implements
      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {
    private final MeshImplBase serviceImpl;
    private final int methodId;

    MethodHandlers(MeshImplBase serviceImpl, int methodId) {
      this.serviceImpl = serviceImpl;
      this.methodId = methodId;
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_WATCH_PEERS:
          serviceImpl.watchPeers((io.anarchon.v1.WatchPeersRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.PeerEvent>) responseObserver);
          break;
        case METHODID_LIST_PEERS:
          serviceImpl.listPeers((io.anarchon.v1.ListPeersRequest) request,
              (io.grpc.stub.StreamObserver<io.anarchon.v1.ListPeersResponse>) responseObserver);
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
        case METHODID_SYNC:
          return (io.grpc.stub.StreamObserver<Req>) serviceImpl.sync(
              (io.grpc.stub.StreamObserver<io.anarchon.v1.SyncFrame>) responseObserver);
        default:
          throw new AssertionError();
      }
    }
  }

  private static abstract class MeshBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    MeshBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return io.anarchon.v1.MeshOuterClass.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("Mesh");
    }
  }

  private static final class MeshFileDescriptorSupplier
      extends MeshBaseDescriptorSupplier {
    MeshFileDescriptorSupplier() {}
  }

  private static final class MeshMethodDescriptorSupplier
      extends MeshBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final String methodName;

    MeshMethodDescriptorSupplier(String methodName) {
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
      synchronized (MeshGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new MeshFileDescriptorSupplier())
              .addMethod(getWatchPeersMethod())
              .addMethod(getListPeersMethod())
              .addMethod(getSyncMethod())
              .build();
        }
      }
    }
    return result;
  }
}
