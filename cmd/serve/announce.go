package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"text/tabwriter"

	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// newLogger is the server's log, at a level the logging extension may
// change at run time. Durations print as Go writes them (1.5s, 250ms) in
// both formats, not as JSON's nanoseconds.
func newLogger(c config.Log, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	level.Set(c.Level)
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			return slog.String(a.Key, a.Value.Duration().String())
		}
		return a
	}}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), level
	}
	return slog.New(slog.NewTextHandler(w, opts)), level
}

// announce says the server is ready: the log line, and, for a person
// reading text logs, the URL, whether each API asks for a token, a table
// of the models and a first request to try.
func announce(w io.Writer, logger *slog.Logger, cfg *config.Config, set *serving.Set, addr net.Addr) {
	url := baseURL(addr)
	if cfg.Server.TLSCertFile != "" {
		url = "https" + strings.TrimPrefix(url, "http")
	}
	// The log line last: whoever waits for it has the whole announcement.
	defer logger.Info("ready", "url", url)
	if cfg.Log.Format == "json" {
		return
	}
	auth := func(tokens []string) string {
		if len(tokens) > 0 {
			return "bearer token"
		}
		return "open"
	}
	repo := "off (server.enable_model_control)"
	if cfg.Server.EnableModelControl {
		repo = auth(cfg.Auth.RepositoryTokens)
	}
	fmt.Fprintf(w, "\nstepserve is ready on %s  (inference: %s; repository API: %s)\n\n", url, auth(cfg.Auth.InferenceTokens), repo)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MODEL\tENGINE\tREPLICAS\tBUCKETS\tINPUTS -> OUTPUTS\tREADY IN")
	ms := set.Models()
	for _, m := range ms {
		cfg := m.Model().Config
		buckets := fmt.Sprint(cfg.Buckets.Batch)
		if len(cfg.Buckets.Seq) > 0 {
			buckets += " x seq " + fmt.Sprint(cfg.Buckets.Seq)
		}
		total, healthy := m.Backend().Replicas()
		fmt.Fprintf(tw, "  %s\t%s\t%d/%d\t%s\t%s -> %s\t%.1fs\n", m.Model().Name, m.Engine(), healthy, total, buckets,
			tensors(cfg.Inputs), tensors(cfg.Outputs), m.ReadyIn().Seconds())
	}
	tw.Flush()
	if len(ms) > 0 {
		fmt.Fprintf(w, "\ntry: curl -s %s/v2/models/%s\n\n", url, ms[0].Model().Name)
	}
}

// baseURL is the URL clients reach a listener at: the loopback address
// when it listens on every address.
func baseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

func tensors(specs []models.TensorSpec) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = fmt.Sprintf("%s %s%v", s.Name, s.Datatype, s.Shape)
	}
	return strings.Join(parts, ", ")
}
