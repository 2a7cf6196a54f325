package testenv

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATS starts an in-process nats-server with JetStream, private to the test,
// and returns its client URL (nats://127.0.0.1:port). The server stores its
// streams in a t.TempDir and is shut down on Cleanup.
//
// It needs no outside service: port 4222 on the machine may be an older NATS
// without the JetStream features the service uses.
func NATS(t testing.TB) (url string) {
	t.Helper()
	return StartNATS(t, "").URL
}

// NATSServer is an in-process nats-server started by StartNATS, for tests
// that take the broker away and bring it back. Its methods are safe for
// concurrent use.
type NATSServer struct {
	URL      string // nats://127.0.0.1:port; the same after Restart
	StoreDir string // JetStream storage, kept across Restart

	t    testing.TB
	name string
	port int

	// A node of a NATSCluster: its cluster name, route port and the routes
	// to every node (empty for a lone server).
	cluster     string
	clusterPort int
	routes      string

	mu  sync.Mutex
	srv *server.Server // nil while shut down
}

// StartNATS starts an in-process nats-server with JetStream on a random
// loopback port, storing streams under storeDir (a new t.TempDir when
// empty), and waits until it accepts clients. It is shut down on Cleanup.
func StartNATS(t testing.TB, storeDir string) *NATSServer {
	t.Helper()
	if storeDir == "" {
		storeDir = t.TempDir()
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &NATSServer{
		StoreDir: storeDir,
		t:        t,
		name:     RandomName("testenv-nats-"),
		port:     port,
	}
	t.Cleanup(s.Shutdown)
	s.start()
	return s
}

// Shutdown stops the server, closing every client connection, and waits
// until it has stopped and flushed its store. Shutting down a stopped server
// does nothing.
func (s *NATSServer) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart starts the server again on the same port and store directory, so
// streams, consumers and stored messages come back; a running server is shut
// down first. Clients reconnect on their own (nats.go retries by default).
// A server that does not come back fails the test.
func (s *NATSServer) Restart() {
	s.t.Helper()
	s.Shutdown()
	s.start()
}

func (s *NATSServer) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.t.Fatalf("testenv: nats-server %s already running", s.URL)
	}
	opts := &server.Options{
		ServerName: s.name,
		Host:       "127.0.0.1",
		Port:       s.port,
		JetStream:  true,
		StoreDir:   s.StoreDir,
		NoLog:      true,
		NoSigs:     true,
	}
	if s.cluster != "" {
		opts.Cluster = server.ClusterOpts{Name: s.cluster, Host: "127.0.0.1", Port: s.clusterPort}
		opts.Routes = server.RoutesFromStr(s.routes)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		s.t.Fatalf("testenv: nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		s.t.Fatalf("testenv: nats-server on 127.0.0.1:%d not ready for connections within 10s", s.port)
	}
	if s.cluster == "" && !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		s.t.Fatalf("testenv: nats-server started without JetStream (store dir %s)", s.StoreDir)
	}
	if s.URL == "" {
		s.URL = srv.ClientURL()
	}
	s.srv = srv
}
