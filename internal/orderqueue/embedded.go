package orderqueue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Embedded is an in-process JetStream server for a single-instance
// deployment. It listens on no port: only this process reaches it.
type Embedded struct {
	srv  *server.Server
	lock *os.File // holds the data directory's lock until Shutdown
}

// LockName is the file in the data directory whose lock says an embedded
// server uses the directory.
const LockName = "flashsale.lock"

// errLocked is lockFile's error for a lock held elsewhere.
var errLocked = errors.New("locked")

// ErrDataDirInUse is returned by StartEmbedded when another embedded server
// (another flashsale serve, most likely) holds the data directory: two
// brokers writing the same files would corrupt the store.
var ErrDataDirInUse = errors.New("data directory in use")

// lockDataDir takes the data directory's exclusive lock (creating the
// directory if need be).
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded JetStream: data directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, LockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("embedded JetStream: data directory: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		if errors.Is(err, errLocked) {
			abs, aerr := filepath.Abs(dir)
			if aerr != nil {
				abs = dir
			}
			return nil, fmt.Errorf("%w: another flashsale runs the embedded JetStream on %s; "+
				"give this one its own directory (-data-dir, FLASHSALE_DATA_DIR), or run both against one external NATS server (-nats-url nats://host:4222)", ErrDataDirInUse, abs)
		}
		return nil, fmt.Errorf("embedded JetStream: locking %s: %w", f.Name(), err)
	}
	return f, nil
}

// StartEmbedded starts a JetStream server storing under dir/nats.
// syncAlways makes every write fsync (survives power loss, slower); by
// default the store syncs every 2 minutes, which survives a process kill.
//
// The server holds an exclusive lock on dir (LockName) until Shutdown: a
// second StartEmbedded on the same directory, in this process or another,
// fails with ErrDataDirInUse.
func StartEmbedded(dir string, syncAlways bool) (_ *Embedded, err error) {
	lock, err := lockDataDir(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
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
	return &Embedded{srv: srv, lock: lock}, nil
}

// Connect returns an in-process client connection.
func (e *Embedded) Connect(name string) (*nats.Conn, error) {
	return nats.Connect("", nats.InProcessServer(e.srv), nats.Name(name), nats.MaxReconnects(-1))
}

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	if e.lock != nil {
		e.lock.Close()
	}
}

// Connect dials an external NATS server, reconnecting forever.
func Connect(url, name string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
}
