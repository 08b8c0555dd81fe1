package server

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/internal/trace"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

func TestBearerScheme(t *testing.T) {
	const tok = "token-0123456789abcdef"
	s, err := New(Options{Models: newSumMax(t).set, InferenceTokens: []string{tok, "other-token-0123456789"}})
	require.NoError(t, err)
	for _, tc := range []struct {
		authorization string
		status        int
		msg           string
	}{
		{"Bearer " + tok, 200, ""},
		{"bearer " + tok, 200, ""},
		{"BEARER " + tok, 200, ""},
		{"bEaReR " + tok, 200, ""},
		{"Bearer   " + tok, 200, ""},
		{"", 401, "missing bearer token"},
		{"Basic " + tok, 401, "missing bearer token"},
		{"Bearer" + tok, 401, "missing bearer token"},
		{"Bearer", 401, "missing bearer token"},
		{"Bearer ", 401, "invalid bearer token"},
		{"Bearer " + tok[:len(tok)-1], 401, "invalid bearer token"},
		{"Bearer " + tok + "x", 401, "invalid bearer token"},
		{"Bearer " + tok + " ", 401, "invalid bearer token"},
	} {
		w := do(t, s, "GET", "/v2/models/summax", nil, "Authorization", tc.authorization)
		assert.Equal(t, tc.status, w.Code, "%q", tc.authorization)
		if tc.status == 401 {
			assert.Contains(t, errorOf(t, w), tc.msg, "%q", tc.authorization)
			assert.Equal(t, `Bearer realm="stepserve"`, w.Header().Get("WWW-Authenticate"))
		}
	}
}

// TestSetTokens: new tokens are in force for the next request, old ones are
// not; the log says what changed and never shows a token; requests racing
// a reload see one set or the other.
func TestSetTokens(t *testing.T) {
	const oldTok, keptTok, newTok, repoTok = "old-token-0123456789", "kept-token-0123456789", "new-token-0123456789", "repo-token-0123456789"
	var log bytes.Buffer
	var mu sync.Mutex
	s, err := New(Options{Models: newSumMax(t).set, InferenceTokens: []string{oldTok, keptTok}, RepositoryTokens: []string{repoTok},
		ModelControl: true, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))})
	require.NoError(t, err)
	status := func(path, tok string) int {
		return do(t, s, "GET", path, nil, "Authorization", "Bearer "+tok).Code
	}
	require.Equal(t, 200, status("/v2/models/summax", oldTok))

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				assert.Equal(t, 200, status("/v2/models/summax", keptTok), "a token in both sets is accepted throughout")
			}
		})
	}
	s.SetTokens([]string{keptTok, newTok}, []string{repoTok})
	wg.Wait()

	assert.Equal(t, 401, status("/v2/models/summax", oldTok))
	assert.Equal(t, 200, status("/v2/models/summax", newTok))
	assert.Equal(t, 200, status("/v2/models/summax", keptTok))
	assert.Equal(t, 401, status("/v2/repository/index", newTok), "scopes stay apart")
	assert.Equal(t, 200, do(t, s, "POST", "/v2/repository/index", nil, "Authorization", "Bearer "+repoTok).Code)

	mu.Lock()
	out := log.String()
	mu.Unlock()
	assert.Contains(t, out, `msg="bearer tokens reloaded" scope=auth.inference tokens=2 added=1 removed=1`)
	assert.Contains(t, out, `msg="bearer tokens reloaded" scope=auth.repository tokens=1 added=0 removed=0`)
	for _, tok := range []string{oldTok, keptTok, newTok, repoTok} {
		assert.NotContains(t, out, tok)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestSetTokensTurningAuthenticationOff(t *testing.T) {
	var log bytes.Buffer
	s, err := New(Options{Models: newSumMax(t).set, InferenceTokens: []string{"token-0123456789abcdef"}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	require.Equal(t, 401, do(t, s, "GET", "/v2/models/summax", nil).Code)
	s.SetTokens(nil, nil)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/models/summax", nil).Code)
	assert.Contains(t, log.String(), `level=WARN msg="bearer tokens reloaded" scope=auth.inference tokens=0 added=0 removed=1`)
	assert.Contains(t, log.String(), `level=INFO msg="bearer tokens reloaded" scope=auth.repository tokens=0 added=0 removed=0`)
}

// The administrator's endpoints are never more open than inference: with
// an inference token and no repository token they are closed (403 over
// HTTP, PERMISSION_DENIED over gRPC) unless left open on purpose; with a
// repository token they take it; with no token anywhere they are open as
// inference is.
func TestAdminEndpointsAreNeverMoreOpenThanInference(t *testing.T) {
	const inferTok, repoTok = "infer-token-0123456789", "repo-token-0123456789"
	admin := []struct{ method, path string }{
		{"GET", "/v2/logging"}, {"POST", "/v2/logging"},
		{"GET", "/v2/trace/setting"}, {"POST", "/v2/trace/setting"},
		{"GET", "/v2/models/summax/trace/setting"},
		{"GET", "/v2/trace/files"}, {"GET", "/v2/trace/files/x.json"},
	}
	for _, tc := range []struct {
		name       string
		opts       Options
		token      string
		httpStatus int
		grpcCode   codes.Code
	}{
		{"inference token only", Options{InferenceTokens: []string{inferTok}}, inferTok, http.StatusForbidden, codes.PermissionDenied},
		{"inference token only, left open on purpose", Options{InferenceTokens: []string{inferTok}, RepositoryAnonymous: true}, "", 0, codes.OK},
		{"a repository token", Options{InferenceTokens: []string{inferTok}, RepositoryTokens: []string{repoTok}}, inferTok, http.StatusUnauthorized, codes.Unauthenticated},
		{"no token anywhere", Options{}, "", 0, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.Models = newSumMax(t).set
			opts.LogLevel = new(slog.LevelVar)
			opts.Tracer = trace.New(trace.Options{Dir: t.TempDir()})
			s, err := New(opts)
			require.NoError(t, err)
			for _, a := range admin {
				body := []byte(nil)
				if a.method == "POST" {
					body = []byte(`{}`)
				}
				req := httptest.NewRequest(a.method, a.path, bytes.NewReader(body))
				if tc.token != "" {
					req.Header.Set("Authorization", "Bearer "+tc.token)
				}
				w := httptest.NewRecorder()
				s.ServeHTTP(w, req)
				if tc.httpStatus != 0 {
					assert.Equal(t, tc.httpStatus, w.Code, "%s %s", a.method, a.path)
				} else {
					assert.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, w.Code, "%s %s: open", a.method, a.path)
				}
				if tc.httpStatus == http.StatusForbidden {
					assert.Contains(t, w.Body.String(), "auth.repository.allow_anonymous")
				}
			}
			// And its own token opens them where there is one.
			if len(tc.opts.RepositoryTokens) > 0 {
				req := httptest.NewRequest("GET", "/v2/logging", nil)
				req.Header.Set("Authorization", "Bearer "+repoTok)
				w := httptest.NewRecorder()
				s.ServeHTTP(w, req)
				assert.Equal(t, http.StatusOK, w.Code)
			}

			c, _ := grpcClients(t, s)
			ctx := context.Background()
			if tc.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.token)
			}
			_, err = c.TraceSetting(ctx, &pb.TraceSettingRequest{})
			assert.Equal(t, tc.grpcCode, status.Code(err), "TraceSetting: %v", err)
		})
	}
}
