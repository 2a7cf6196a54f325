package orderqueue

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Embedded is an in-process JetStream server for a single-instance
// deployment. It listens on no port: only this process reaches it.
//
// It restarts itself when its store cannot write. nats-server keeps a
// store's write error (a full disk, an I/O error) on the stream until the
// stream is reopened, and until then answers no publish: one failed write
// would stop the order stream for good while purchases pile up in the Redis
// outbox. A watcher checks the server's health every HealthEvery and, while
// a stream reports a write error and the store's filesystem has room again
// (at least MinFree bytes), restarts the server on the same store, at most
// once per backoff (1 s doubling to 30 s while it keeps failing). Clients
// made by Connect reconnect to the new server by themselves; what the old
// one had acknowledged is read back from the store.
type Embedded struct {
	opts *server.Options
	log  *slog.Logger
	lock *os.File // holds the data directory's lock until Shutdown

	mu       sync.Mutex
	srv      *server.Server
	health   error // what the watcher last found (nil: healthy)
	restarts int

	stop chan struct{}
	done chan struct{}
	once sync.Once
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

// Watcher settings of Embedded.
const (
	HealthEvery = 250 * time.Millisecond
	MinFree     = 1 << 20
)

// ErrStoreFull wraps the write error of an embedded store whose disk has
// not yet got room back (MinFree bytes).
var ErrStoreFull = errors.New("orderqueue: embedded store cannot write (disk full?)")

// StartEmbedded starts a JetStream server storing under dir/nats.
// syncAlways makes every write fsync (survives power loss, slower); by
// default the store syncs every 2 minutes, which survives a process kill.
// log (nil: discarded) receives the watcher's restarts.
//
// The server holds an exclusive lock on dir (LockName) until Shutdown,
// across its restarts: a second StartEmbedded on the same directory, in
// this process or another, fails with ErrDataDirInUse.
func StartEmbedded(dir string, syncAlways bool, log *slog.Logger) (_ *Embedded, err error) {
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
	e := &Embedded{opts: opts, log: slog.New(slog.DiscardHandler), lock: lock, stop: make(chan struct{}), done: make(chan struct{})}
	if log != nil {
		e.log = log
	}
	srv, err := startServer(opts)
	if err != nil {
		return nil, err
	}
	e.srv = srv
	go e.watch()
	return e, nil
}

func startServer(opts *server.Options) (*server.Server, error) {
	srv, err := server.NewServer(opts.Clone())
	if err != nil {
		return nil, fmt.Errorf("orderqueue: embedded server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("orderqueue: embedded server not ready after 15s")
	}
	return srv, nil
}

// InProcessConn connects to the current server (nats.InProcessConnProvider):
// a client reconnecting after a restart reaches the new one.
func (e *Embedded) InProcessConn() (net.Conn, error) {
	e.mu.Lock()
	srv := e.srv
	e.mu.Unlock()
	return srv.InProcessConn()
}

// Connect returns an in-process client connection. It reconnects forever,
// to the restarted server after a restart.
func (e *Embedded) Connect(name string) (*nats.Conn, error) {
	return nats.Connect("", nats.InProcessServer(e), nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond))
}

// Health is nil while the server's streams can store messages; else what
// the watcher found (a stream's write error, wrapping ErrStoreFull while
// the disk has no room).
func (e *Embedded) Health() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.health
}

// Restarts counts the watcher's restarts of the server.
func (e *Embedded) Restarts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restarts
}

// check asks the server whether every stream can store: it returns the
// first stream write error the server's health check reports, or its
// report that JetStream is off (nats-server turns JetStream off on a store
// permission error, and on a full disk under a sourced or mirrored
// stream), and nothing for the check's other findings. Those are not what
// a restart mends and pass by themselves: a stream whose directory is on
// disk but not yet open ("could not be recovered") is one being created,
// and a server still starting is not "ready for connections"; a restart in
// either would fail the very work it interrupts.
func (e *Embedded) check() error {
	e.mu.Lock()
	srv := e.srv
	e.mu.Unlock()
	for _, he := range srv.Healthz(&server.HealthzOptions{Details: true}).Errors {
		if he.Type == server.HealthzErrorJetStream ||
			he.Type == server.HealthzErrorStream && strings.Contains(he.Error, "write error") {
			return errors.New(he.Error)
		}
	}
	return nil
}

// watch restarts the server while it is unhealthy and its disk has room.
func (e *Embedded) watch() {
	defer close(e.done)
	t := time.NewTicker(HealthEvery)
	defer t.Stop()
	backoff, next := time.Second, time.Time{}
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		err := e.check()
		if err == nil {
			e.setHealth(nil)
			backoff = time.Second
			continue
		}
		if free, ok := freeBytes(e.opts.StoreDir); ok && free < MinFree {
			e.setHealth(fmt.Errorf("%w: %v (%d bytes free)", ErrStoreFull, err, free))
			continue
		}
		e.setHealth(err)
		if time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(backoff)
		backoff = min(2*backoff, 30*time.Second)
		if rerr := e.restart(); rerr != nil {
			e.log.Error("embedded jetstream: restart after a store error failed", "store_err", err, "err", rerr)
			continue
		}
		e.log.Warn("embedded jetstream restarted: a stream could not write to its store", "store_err", err)
	}
}

func (e *Embedded) setHealth(err error) {
	e.mu.Lock()
	e.health = err
	e.mu.Unlock()
}

// restart shuts the server down and starts a new one on the same store.
func (e *Embedded) restart() error {
	e.mu.Lock()
	old := e.srv
	e.mu.Unlock()
	old.Shutdown()
	old.WaitForShutdown()
	srv, err := startServer(e.opts)
	if err != nil {
		// Try again on the next tick; clients keep reconnecting to the old
		// (stopped) one meanwhile.
		return err
	}
	e.mu.Lock()
	e.srv = srv
	e.restarts++
	e.mu.Unlock()
	return nil
}

// Shutdown stops the watcher and the server and waits for them.
func (e *Embedded) Shutdown() {
	e.once.Do(func() {
		close(e.stop)
		<-e.done
		e.mu.Lock()
		srv := e.srv
		e.mu.Unlock()
		srv.Shutdown()
		srv.WaitForShutdown()
		if e.lock != nil {
			e.lock.Close()
		}
	})
}

// Connect dials an external NATS server, reconnecting forever.
func Connect(url, name string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
}
