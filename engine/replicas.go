package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/models"
)

// Stepper runs one model's steps on one set of staging buffers: a
// [Program], or one [Replica] of it. Steps on one Stepper are serialized by
// its caller, because they share its staging buffers.
type Stepper interface {
	// Compile builds bucket's graph if it is not built yet.
	Compile(ctx context.Context, bucket int) error
	// Step runs bucket's graph: one copy of the input staging onto the
	// device, the graph, one copy of the packed outputs back to the output
	// staging. A bucket not compiled before is compiled first, and the
	// report counts that as a recompile.
	Step(ctx context.Context, bucket int) (Explain, error)
	// Staging returns bucket's input and output buffers, laid out as
	// [NewLayout] says. They live as long as the Program.
	Staging(bucket int) (in, out []byte)
	// Healthy reports whether steps can run now; false while the device
	// behind it is down or being restarted.
	Healthy() bool
}

// Replica is one copy of a loaded model that steps on its own staging
// buffers: the model loaded on one device, or one lane of a device that
// holds several (while one lane steps, the next batch is packed into
// another's staging). Steps on different replicas may run at the same
// time; steps on one replica are serialized by its caller.
type Replica interface {
	Stepper
	// Device names where the replica runs, as the engine names its
	// devices ("0", "cpu"); replicas with the same Device share that
	// device, and a caller balancing load counts steps per Device.
	// Empty when the engine does not say.
	Device() string
}

// Follower is a Replica that shares its device graphs with an earlier
// replica of the same program (another staging lane of it): warming that
// one up warms this one, whose own warm-up then runs nothing.
type Follower interface {
	Replica
	// Follows is the replica this one shares graphs with; nil when none.
	Follows() Replica
}

// Replicated is a Program loaded several times: on several devices, or as
// several lanes of one (model.yaml's instances). Its own Compile, Step,
// Staging and Healthy are those of its first replica, so that a caller
// that knows nothing of replicas runs on one; Close closes every replica.
type Replicated interface {
	Program
	// Replicas are the copies, in the order the engine placed them. The
	// list does not change for the Program's life.
	Replicas() []Replica
}

// ReplicasOf lists p's replicas: those of a [Replicated], or p itself as
// the one replica of a plain Program (its Device is p's Device method's,
// or empty).
func ReplicasOf(p Program) []Replica {
	if r, ok := p.(Replicated); ok {
		return r.Replicas()
	}
	if r, ok := p.(Replica); ok {
		return []Replica{r}
	}
	return []Replica{single{p}}
}

// single is a plain Program as a Replica with no device name.
type single struct{ Program }

func (single) Device() string { return "" }

// DeviceProgram is a Program that knows its device: one replica, or, when
// it is [Replicated] itself, several.
type DeviceProgram interface {
	Program
	Device() string
}

// Replicate groups programs, each loaded once on its own device or lane,
// into one Program whose replicas are theirs in order (a program that is
// Replicated itself brings all of its replicas). One program is returned
// as it is.
func Replicate[P DeviceProgram](ps []P) Program {
	if len(ps) == 1 {
		return ps[0]
	}
	g := &group{}
	for _, p := range ps {
		g.programs = append(g.programs, p)
		g.replicas = append(g.replicas, ReplicasOf(p)...)
	}
	return g
}

// group is the Replicated that [Replicate] makes.
type group struct {
	programs []Program
	replicas []Replica
}

func (g *group) Replicas() []Replica { return slices.Clone(g.replicas) }

func (g *group) Compile(ctx context.Context, bucket int) error {
	return g.replicas[0].Compile(ctx, bucket)
}

func (g *group) Step(ctx context.Context, bucket int) (Explain, error) {
	return g.replicas[0].Step(ctx, bucket)
}

func (g *group) Staging(bucket int) (in, out []byte) { return g.replicas[0].Staging(bucket) }

func (g *group) Healthy() bool { return g.replicas[0].Healthy() }

func (g *group) Close() error {
	var errs []error
	for _, p := range g.programs {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// Placer is an [Engine] whose devices model.yaml's instances may name.
type Placer interface {
	// DeviceNames are the engine's devices, in its order.
	DeviceNames() []string
}

// Placement is the device of every replica of a model whose model.yaml
// says in, on an engine whose devices are devices (in the engine's
// order): each listed device (every device for `all`; next, the engine's
// choice, when none is listed) per_device times. Replicas are interleaved
// across devices (0, 1, 0, 1), so that taking them in turn spreads the
// load. A listed device the engine does not have is an error naming the
// ones it has.
func Placement(engine string, in models.Instances, devices []string, next string) ([]string, error) {
	var chosen []string
	switch {
	case in.All:
		chosen = devices
	case len(in.Devices) > 0:
		for _, d := range in.Devices {
			if !slices.Contains(devices, d) {
				return nil, fmt.Errorf("instances.devices: engine %s has no device %q; its devices are %s (or write devices: all)",
					engine, d, strings.Join(devices, ", "))
			}
		}
		chosen = in.Devices
	default:
		chosen = []string{next}
	}
	if len(chosen) == 0 {
		return nil, fmt.Errorf("instances.devices: engine %s has no device to load on", engine)
	}
	out := make([]string, 0, len(chosen)*in.PerDeviceCount())
	for range in.PerDeviceCount() {
		out = append(out, chosen...)
	}
	if n := in.MinReadyCount(); n > len(out) {
		return nil, fmt.Errorf("instances.min_ready: %d is more than the %d replicas placed on engine %s (%s)",
			n, len(out), engine, strings.Join(out, ", "))
	}
	return out, nil
}

// Programs implements [ProgramReporter]: every replica's programs, each
// named with its device.
func (g *group) Programs(ctx context.Context) []ProgramReport {
	var out []ProgramReport
	for _, p := range g.programs {
		if r, ok := p.(ProgramReporter); ok {
			out = append(out, r.Programs(ctx)...)
		}
	}
	return out
}
