package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/dsynclock/dsync/internal/mariadb"
)

// servers are the throwaway servers of one benchmark run, all on 127.0.0.1,
// each in a temporary directory of its own that stop removes.
type servers struct {
	maria    *mariadb.Server
	dbName   string         // the benchmark's database on maria
	redis    []*redisServer // without persistence, then with appendfsync always
	etcd     *embed.Etcd
	etcdDir  string
	etcdURL  string // client URL
	versions map[string]string
}

// redisServer is one redis-server process started by startRedis.
type redisServer struct {
	label string // "redis" or "redis-aof"
	desc  string // its persistence settings, for the report
	addr  string
	dir   string
	cmd   *exec.Cmd
}

// startServers starts MariaDB, the two redis-servers and an embedded etcd.
// On error whatever did start is stopped again.
func startServers(ctx context.Context) (s *servers, err error) {
	s = &servers{dbName: "bench", versions: map[string]string{}}
	defer func() {
		if err != nil {
			s.stop()
			s = nil
		}
	}()
	logf("starting MariaDB")
	if s.maria, err = mariadb.Start(ctx); err != nil {
		return s, err
	}
	db, err := sql.Open("mysql", s.maria.DSN(""))
	if err != nil {
		return s, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+s.dbName); err != nil {
		return s, err
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return s, err
	}
	s.versions["mariadb"] = v

	for _, r := range []struct{ label, desc string }{
		{"redis", "no persistence (`--save '' --appendonly no`)"},
		{"redis-aof", "`--appendonly yes --appendfsync always`"},
	} {
		logf("starting %s", r.label)
		rs, err := startRedis(ctx, r.label, r.desc)
		if err != nil {
			return s, err
		}
		s.redis = append(s.redis, rs)
	}
	c := redis.NewClient(&redis.Options{Addr: s.redis[0].addr})
	info, err := c.Info(ctx, "server").Result()
	c.Close()
	if err != nil {
		return s, err
	}
	s.versions["redis"] = infoField(info, "redis_version")

	logf("starting etcd (embedded)")
	if err := s.startEtcd(); err != nil {
		return s, err
	}
	s.versions["etcd"] = etcdVersion()
	return s, nil
}

// mysqlDSN returns the DSN of the benchmark's database.
func (s *servers) mysqlDSN() string { return s.maria.DSN(s.dbName) }

// stop stops every server that was started and removes their directories.
func (s *servers) stop() {
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
	if s.etcdDir != "" {
		os.RemoveAll(s.etcdDir)
		s.etcdDir = ""
	}
	for _, r := range s.redis {
		r.stop()
	}
	s.redis = nil
	if s.maria != nil {
		if err := s.maria.Stop(); err != nil {
			logf("stopping MariaDB: %v", err)
		}
		s.maria = nil
	}
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startRedis starts redis-server on a free port, without persistence for
// "redis" and with an append-only file fsynced on every write for
// "redis-aof", and waits until it answers PING.
func startRedis(ctx context.Context, label, desc string) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found; make bench-peers installs it (apt-get install redis-server)")
	}
	dir, err := os.MkdirTemp("", "dsync-bench-"+label+"-")
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		args := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
			"--daemonize", "no", "--save", "",
		}
		if label == "redis-aof" {
			args = append(args, "--appendonly", "yes", "--appendfsync", "always")
		} else {
			args = append(args, "--appendonly", "no")
		}
		cmd := exec.Command(bin, args...)
		// The server dies with this process, however it ends.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		r := &redisServer{label: label, desc: desc, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd}
		if err := r.waitReady(ctx); err == nil {
			return r, nil
		} else if attempt == 2 || ctx.Err() != nil {
			r.stop()
			return nil, fmt.Errorf("%s did not come up: %w", label, err)
		}
		r.kill() // most likely the port was taken meanwhile: try another
	}
}

func (r *redisServer) waitReady(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1})
	defer c.Close()
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err = c.Ping(ctx).Err(); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return err
}

// kill ends the process with SIGKILL and reaps it, keeping the directory.
func (r *redisServer) kill() {
	if r.cmd != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// stop shuts the server down (SIGTERM, SIGKILL after 10 s) and removes its
// directory.
func (r *redisServer) stop() {
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = r.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = r.cmd.Process.Kill()
			<-done
		}
		r.cmd = nil
	}
	os.RemoveAll(r.dir)
}

// infoField returns field's value in a redis INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// startEtcd starts an embedded single-member etcd on free loopback ports,
// with its data in a temporary directory.
func (s *servers) startEtcd() error {
	dir, err := os.MkdirTemp("", "dsync-bench-etcd-")
	if err != nil {
		return err
	}
	s.etcdDir = dir
	cport, err := freePort()
	if err != nil {
		return err
	}
	pport, err := freePort()
	if err != nil {
		return err
	}
	curl, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(cport))
	purl, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(pport))
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	s.etcd = e
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("etcd: %w", err)
	case <-time.After(60 * time.Second):
		return errors.New("etcd did not become ready within 60s")
	}
	s.etcdURL = curl.String()
	return nil
}
