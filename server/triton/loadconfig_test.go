package triton

import (
	"bytes"
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// FuzzReadConfig holds a load config's reader to protojson, protobuf's
// JSON rules as Triton reads the config: whatever it accepts, protojson
// reads to the same ModelConfig. (It refuses more: the fields stepserve
// does not apply, enum numbers the proto does not name.)
func FuzzReadConfig(f *testing.F) {
	for _, s := range []string{
		`{"name":"m","max_batch_size":"8","dynamic_batching":{"preferredBatchSize":["2",4],"max_queue_delay_microseconds":"1500",` +
			`"priority_levels":3,"default_priority_level":"2","default_queue_policy":{"default_timeout_microseconds":250000,"maxQueueSize":"7"}},` +
			`"instance_group":[{"count":"2","kind":"KIND_CPU","gpus":[0,"1"],"name":"g"}]}`,
		`{"max_batch_size":2.0e0,"instance_group":[{"kind":2}]}`,
		`{"maxBatchSize":null,"dynamic_batching":{}}`,
		`{"instance_group":[]}`,
		`{"max_batch_size":"4294967296"}`,
		`{"dynamic_batching":{"max_queue_delay_microseconds":-1}}`,
		`{"instance_group":[{"kind":"KIND_TPU"}]}`,
		`{"input":[{"data_type":"TYPE_FP32"}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		cfg, _, err := readConfig(text)
		if err != nil {
			if core.StatusOf(err) != 400 {
				t.Fatalf("status %d for a bad config: %v", core.StatusOf(err), err)
			}
			return
		}
		var want pb.ModelConfig
		if err := protojson.Unmarshal([]byte(text), &want); err != nil {
			if repeatsAKey([]byte(text)) {
				return // encoding/json keeps the last; protojson refuses
			}
			t.Fatalf("accepted %q, which protojson refuses: %v", text, err)
		}
		if !proto.Equal(cfg, &want) {
			t.Fatalf("read %q as %v; protojson reads %v", text, cfg, &want)
		}
	})
}

// repeatsAKey reports whether a JSON object in b names a key twice.
func repeatsAKey(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	type level struct {
		keys   map[string]bool
		object bool
		key    bool // the next string is a key
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &level{keys: map[string]bool{}, object: v == '{', key: v == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.object && top.key {
				if top.keys[v] {
					return true
				}
				top.keys[v] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}
