package serving

import "github.com/stepserve/stepserve/batching"

// What a model's configuration endpoint reports beyond model.yaml: how the
// server placed and batches it.

// Policy is the batching policy the model is served with: the server's
// defaults with model.yaml's batching keys over them.
func (m *Model) Policy() batching.Policy {
	if m.gen != nil {
		return batching.Policy{}
	}
	return m.batcher.Policy()
}

// Devices names the device of each of the model's replicas on its own
// engine, in replica order (a device appears once per replica on it).
func (m *Model) Devices() []string {
	if m.gen != nil {
		return []string{m.engine}
	}
	out := make([]string, len(m.runners))
	for i, r := range m.runners {
		out[i] = r.Device()
	}
	return out
}

// Failover is the engine that serves the model while none of its
// replicas is healthy, and the device of its one replica there; empty
// when it has none.
func (m *Model) Failover() (engine, device string) {
	if m.fallback == nil {
		return "", ""
	}
	return m.fbEngine, m.fallback.Device()
}
