// HTTP compression, as Triton's clients use it: request bodies sent with
// Content-Encoding gzip or deflate are decompressed as they are read, the
// body limit applying to what they decompress to; responses are compressed
// when Accept-Encoding asks for it and the body is large enough to gain.

package core

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/stepserve/stepserve/server/apierr"
)

// minCompressBytes is the smallest response worth compressing: below it,
// the encoding's header and the CPU cost more than the bytes saved.
const minCompressBytes = 1024

// decodedBody is r's body as the request means it: decompressed for
// Content-Encoding gzip or deflate (zlib, or raw deflate as some clients
// send), as it is for identity or none. Any other encoding is refused with
// 415, naming it. The caller bounds what it reads from the result.
func decodedBody(r *http.Request) (io.Reader, bool, error) {
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity":
		return r.Body, false, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, true, apierr.BadRequest(fmt.Sprintf("the body is not gzip (Content-Encoding: gzip): %v", err))
		}
		return zr, true, nil
	case "deflate":
		// RFC 9110's deflate is zlib-wrapped; some clients send the raw
		// stream. The zlib header (a deflate method byte whose header
		// checksum holds) tells them apart.
		br := bufio.NewReader(r.Body)
		head, err := br.Peek(2)
		if err != nil {
			return nil, true, apierr.BadRequest(fmt.Sprintf("the body is not deflate (Content-Encoding: deflate): %v", err))
		}
		if head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
			zr, err := zlib.NewReader(br)
			if err != nil {
				return nil, true, apierr.BadRequest(fmt.Sprintf("the body is not deflate (Content-Encoding: deflate): %v", err))
			}
			return zr, true, nil
		}
		return flate.NewReader(br), true, nil
	}
	return nil, false, &apierr.Error{Status: http.StatusUnsupportedMediaType,
		Msg: fmt.Sprintf("Content-Encoding %q is not supported; send gzip, deflate or identity", apierr.ClipName(enc))}
}

// CompressResponses compresses the responses of next that are at least
// minCompressBytes long when the client's Accept-Encoding takes gzip or
// deflate (gzip preferred at equal weight) over identity.
//
// Mount it on inference routes only, as Triton compresses only inference
// answers: tritonclient's http.aio turns aiohttp's decompression off, and
// aiohttp sends Accept-Encoding on every request, so a compressed
// statistics or configuration answer fails to decode there.
func CompressResponses(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := acceptedEncoding(r.Header.Get("Accept-Encoding"))
		if enc == "" {
			next.ServeHTTP(w, r)
			return
		}
		cw := &compressWriter{ResponseWriter: w, enc: enc}
		defer cw.close()
		next.ServeHTTP(cw, r)
	})
}

// acceptedEncoding is the compression an Accept-Encoding header takes: gzip,
// deflate, or "" when it takes neither, weighs identity above them, or
// the request has no header.
func acceptedEncoding(header string) string {
	if header == "" {
		return ""
	}
	best, bestQ, identityQ := "", 0.0, 0.0
	for rest := header; rest != ""; {
		var part string
		part, rest, _ = strings.Cut(rest, ",")
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		name = strings.ToLower(strings.TrimSpace(name))
		q := 1.0
		if k, v, ok := strings.Cut(strings.TrimSpace(params), "="); ok && strings.TrimSpace(k) == "q" {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				q = f
			}
		}
		if name == "identity" {
			identityQ = q
			continue
		}
		if name == "*" {
			name = "gzip"
		}
		if (name == "gzip" || name == "deflate") && q > 0 && (q > bestQ || q == bestQ && name == "gzip") {
			best, bestQ = name, q
		}
	}
	if identityQ > bestQ {
		return ""
	}
	return best
}

// Compressors are pooled: each holds hundreds of KiB of state.
var (
	gzipWriters = sync.Pool{New: func() any { w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed); return w }}
	zlibWriters = sync.Pool{New: func() any { w, _ := zlib.NewWriterLevel(nil, zlib.BestSpeed); return w }}
)

// compressWriter compresses a response whose declared length is large
// enough; others pass through.
type compressWriter struct {
	http.ResponseWriter
	enc     string
	z       interface{ io.WriteCloser }
	pool    *sync.Pool
	decided bool
}

func (c *compressWriter) WriteHeader(status int) {
	if !c.decided {
		c.decided = true
		h := c.Header()
		n, err := strconv.Atoi(h.Get("Content-Length"))
		// Event streams go as they are: each event flushed whole, readable
		// by any client and proxy as it comes.
		if status == http.StatusOK && h.Get("Content-Encoding") == "" && h.Get("Content-Type") != "text/event-stream" && (err != nil || n >= minCompressBytes) {
			h.Del("Content-Length")
			h.Set("Content-Encoding", c.enc)
			h.Add("Vary", "Accept-Encoding")
			switch c.enc {
			case "gzip":
				zw := gzipWriters.Get().(*gzip.Writer)
				zw.Reset(c.ResponseWriter)
				c.z, c.pool = zw, &gzipWriters
			default:
				zw := zlibWriters.Get().(*zlib.Writer)
				zw.Reset(c.ResponseWriter)
				c.z, c.pool = zw, &zlibWriters
			}
		}
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *compressWriter) Write(b []byte) (int, error) {
	if !c.decided {
		c.WriteHeader(http.StatusOK)
	}
	if c.z != nil {
		return c.z.Write(b)
	}
	return c.ResponseWriter.Write(b)
}

// Flush lets a handler that streams flush through the compressor.
func (c *compressWriter) Flush() {
	if f, ok := c.z.(interface{ Flush() error }); ok {
		f.Flush()
	}
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (c *compressWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *compressWriter) close() {
	if c.z == nil {
		return
	}
	c.z.Close()
	c.pool.Put(c.z)
	c.z = nil
}
