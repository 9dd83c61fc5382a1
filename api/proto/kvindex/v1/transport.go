package kvindexv1

import (
	"time"

	"google.golang.org/grpc"
)

// FlowControlWindow is the HTTP/2 flow-control window, per stream and per
// connection, that kvindex's gRPC servers and clients announce. A fixed window
// turns off grpc-go's bandwidth-delay estimator, which sends a ping whenever
// data arrives and no ping is out: on a connection carrying one query at a
// time that is a ping and its ack for every query, on each side. With both
// sides fixed a Score costs each process ~20 % less CPU (bench/RESULTS.md,
// "Fixed flow-control windows"). 1 MiB covers a 1 GB/s stream at 1 ms round
// trip (20 MB/s at 50 ms: a Watch or Dump across regions is slower than the
// estimator would let it be), and holds each stream's unread data to 1 MiB,
// where the estimator lets a window grow to 16 MiB.
const FlowControlWindow = 1 << 20

// KeepaliveMinTime is the shortest keepalive ping interval kvindex's gRPC
// servers permit a client; a client pinging more often has its connection
// closed (GOAWAY too_many_pings).
const KeepaliveMinTime = 10 * time.Second

// FlowControlServerOptions fixes a server's receive windows at FlowControlWindow.
func FlowControlServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StaticStreamWindowSize(FlowControlWindow),
		grpc.StaticConnWindowSize(FlowControlWindow),
	}
}

// FlowControlDialOptions fixes a client's receive windows at FlowControlWindow.
func FlowControlDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(FlowControlWindow),
		grpc.WithStaticConnWindowSize(FlowControlWindow),
	}
}
