// Package tlsfiles serves a certificate and key from files that may be
// replaced while the server runs, as cert-manager, KServe and Kubernetes'
// secret volumes replace them: each handshake takes the pair the files
// hold, read again when they change.
package tlsfiles

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// recheck bounds how often the files are looked at: a handshake at most
// once a second pays two stats.
const recheck = time.Second

// Pair is a certificate and key read from files.
type Pair struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]stamp  // the files as cert was read from them
	checked time.Time // when the files were last looked at
}

type stamp struct {
	mod  time.Time
	size int64
}

// Load reads the pair; an error names the file that is wrong. logger
// (nil: slog's default) hears of a replacement read, or refused.
func Load(certFile, keyFile string, logger *slog.Logger) (*Pair, error) {
	if logger == nil {
		logger = slog.Default()
	}
	p := &Pair{certFile: certFile, keyFile: keyFile, logger: logger}
	cert, st, err := p.read()
	if err != nil {
		return nil, err
	}
	p.cert, p.stamp, p.checked = cert, st, time.Now()
	return p, nil
}

func (p *Pair) read() (*tls.Certificate, [2]stamp, error) {
	var st [2]stamp
	for i, f := range []string{p.certFile, p.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, st, fmt.Errorf("tls: %w", err)
		}
		st[i] = stamp{fi.ModTime(), fi.Size()}
	}
	cert, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		return nil, st, fmt.Errorf("tls: %s and %s: %w", p.certFile, p.keyFile, err)
	}
	return &cert, st, nil
}

// Certificate is the pair now in the files. When they changed and no
// longer make a pair (a half-written replacement), the last good one
// stays until they do.
func (p *Pair) Certificate() *tls.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.checked) < recheck {
		return p.cert
	}
	p.checked = now
	var st [2]stamp
	for i, f := range []string{p.certFile, p.keyFile} {
		if fi, err := os.Stat(f); err == nil {
			st[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	if st == p.stamp {
		return p.cert
	}
	cert, st, err := p.read()
	if err != nil {
		p.logger.Warn("TLS certificate files changed but are not a pair; the previous certificate stays", "err", err)
		return p.cert
	}
	p.cert, p.stamp = cert, st
	p.logger.Info("TLS certificate reloaded", "cert_file", p.certFile)
	return p.cert
}

// Config is a server configuration presenting the pair, offering the
// application protocols nextProtos (ALPN: "h2", "http/1.1").
func (p *Pair) Config(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return p.Certificate(), nil
		},
	}
}
