package orderqueue

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Embedded is an in-process JetStream server for a single-instance
// deployment. It listens on no port: only this process reaches it.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts a JetStream server storing under dir/nats.
// syncAlways makes every write fsync (survives power loss, slower); by
// default the store syncs every 2 minutes, which survives a process kill.
func StartEmbedded(dir string, syncAlways bool) (*Embedded, error) {
	opts := &server.Options{
		ServerName: "flashsale-embedded",
		JetStream:  true,
		StoreDir:   filepath.Join(dir, "nats"),
		DontListen: true,
		NoSigs:     true,
		NoLog:      true,
		SyncAlways: syncAlways,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("orderqueue: embedded server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("orderqueue: embedded server not ready after 15s")
	}
	return &Embedded{srv: srv}, nil
}

// Connect returns an in-process client connection.
func (e *Embedded) Connect(name string) (*nats.Conn, error) {
	return nats.Connect("", nats.InProcessServer(e.srv), nats.Name(name), nats.MaxReconnects(-1))
}

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// Connect dials an external NATS server, reconnecting forever.
func Connect(url, name string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
}
