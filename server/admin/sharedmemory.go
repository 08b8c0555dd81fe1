package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/server/apierr"
)

// Triton's system shared-memory extension over HTTP; [core.SharedMemory]
// does the work, which gRPC shares:
//
//	GET  /v2/systemsharedmemory[/region/{name}]/status
//	POST /v2/systemsharedmemory/region/{name}/register   {"key": "/shm_key", "offset": 0, "byte_size": N}
//	POST /v2/systemsharedmemory[/region/{name}]/unregister

// maxRegisterBody bounds a register request's body: three short fields.
const maxRegisterBody = 4 << 10

// regionName is the route's region name, unescaped (tritonclient quotes
// it in the URL); "" when the route names none.
func regionName(r *http.Request) (string, error) {
	raw := chi.URLParam(r, "name")
	if r.URL.RawPath == "" {
		return raw, nil // chi routed on the unescaped path
	}
	name, err := url.PathUnescape(raw)
	if err != nil {
		return "", apierr.BadRequest(fmt.Sprintf("region name %s is not a valid URL path segment", strconv.Quote(clip.Clip(raw, 64))))
	}
	return name, nil
}

func (s *API) sharedMemoryStatus(r *http.Request) (any, error) {
	name, err := regionName(r)
	if err != nil {
		return nil, err
	}
	return s.c.SharedMemory.Status(name)
}

func (s *API) sharedMemoryRegister(r *http.Request) (any, error) {
	name, err := regionName(r)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxRegisterBody))
	if err != nil {
		return nil, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("failed to register shared memory region: the body is at most %d bytes", maxRegisterBody)}
	}
	key, offset, byteSize, err := decodeRegister(body)
	if err != nil {
		return nil, apierr.BadRequest(fmt.Sprintf("failed to register shared memory region: %v; send %s", err, registerShape))
	}
	if err := s.c.SharedMemory.Register(name, key, offset, byteSize); err != nil {
		return nil, err
	}
	return map[string]any{"name": name, "registered": true}, nil
}

func (s *API) sharedMemoryUnregister(r *http.Request) (any, error) {
	name, err := regionName(r)
	if err != nil {
		return nil, err
	}
	if err := s.c.SharedMemory.Unregister(r.Context(), name); err != nil {
		return nil, err
	}
	if name == "" {
		return map[string]any{"unregistered": "all"}, nil
	}
	return map[string]any{"name": name, "unregistered": true}, nil
}

const registerShape = `{"key": "/shm_key", "offset": 0, "byte_size": N}`

// decodeRegister reads a register request's body: key (a string) and
// byte_size are required, offset is 0 when left out, and no other field is
// taken.
func decodeRegister(body []byte) (key string, offset, byteSize uint64, err error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return "", 0, 0, errors.New("the body is not a JSON object")
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if k != "key" && k != "offset" && k != "byte_size" {
			return "", 0, 0, fmt.Errorf("unknown field %s", strconv.Quote(clip.Clip(k, 64)))
		}
	}
	raw, ok := fields["key"]
	if !ok {
		return "", 0, 0, errors.New("key is required")
	}
	if json.Unmarshal(raw, &key) != nil {
		return "", 0, 0, fmt.Errorf("key must be a string, got %s", clip.Clip(raw, 32))
	}
	number := func(field string, required bool) (uint64, error) {
		raw, ok := fields[field]
		if !ok {
			if required {
				return 0, fmt.Errorf("%s is required", field)
			}
			return 0, nil
		}
		var v uint64
		if json.Unmarshal(raw, &v) != nil {
			return 0, fmt.Errorf("%s must be a non-negative integer (bytes), got %s", field, clip.Clip(raw, 32))
		}
		return v, nil
	}
	if offset, err = number("offset", false); err != nil {
		return "", 0, 0, err
	}
	if byteSize, err = number("byte_size", true); err != nil {
		return "", 0, 0, err
	}
	return key, offset, byteSize, nil
}
