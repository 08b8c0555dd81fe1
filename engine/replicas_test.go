package engine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

func TestPlacement(t *testing.T) {
	devices := []string{"0", "1", "2"}
	for _, tc := range []struct {
		name string
		in   models.Instances
		want []string
		err  string
	}{
		{"unset: the engine's next device", models.Instances{}, []string{"1"}, ""},
		{"per_device alone", models.Instances{PerDevice: 2}, []string{"1", "1"}, ""},
		{"listed", models.Instances{Devices: []string{"2", "0"}}, []string{"2", "0"}, ""},
		{"all, interleaved", models.Instances{All: true, PerDevice: 2}, []string{"0", "1", "2", "0", "1", "2"}, ""},
		{"unknown device", models.Instances{Devices: []string{"0", "5"}}, nil,
			`instances.devices: engine rbln has no device "5"; its devices are 0, 1, 2 (or write devices: all)`},
		{"min_ready above the replicas", models.Instances{All: true, MinReady: 4}, nil,
			"instances.min_ready: 4 is more than the 3 replicas placed on engine rbln (0, 1, 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Placement("rbln", tc.in, devices, "1")
			if tc.err != "" {
				assert.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// fakeProgram is a Program on a named device that counts its steps.
type fakeProgram struct {
	device        string
	steps, closed int
}

func (p *fakeProgram) Compile(context.Context, int) error { return nil }
func (p *fakeProgram) Step(context.Context, int) (Explain, error) {
	p.steps++
	return Explain{}, nil
}
func (p *fakeProgram) Staging(int) (in, out []byte) { return nil, nil }
func (p *fakeProgram) Healthy() bool                { return p.closed == 0 }
func (p *fakeProgram) Close() error                 { p.closed++; return nil }
func (p *fakeProgram) Device() string               { return p.device }

func TestReplicate(t *testing.T) {
	one := &fakeProgram{device: "0"}
	assert.Same(t, one, Replicate([]*fakeProgram{one}), "one program is its own replica")
	assert.Equal(t, []Replica{one}, ReplicasOf(one))

	a, b, c := &fakeProgram{device: "0"}, &fakeProgram{device: "1"}, &fakeProgram{device: "1"}
	g := Replicate([]DeviceProgram{a, laned{Replicated: Replicate([]*fakeProgram{b, c}).(Replicated), device: "1"}})
	reps := ReplicasOf(g)
	require.Len(t, reps, 3, "a replicated program brings all its replicas")
	assert.Equal(t, []string{"0", "1", "1"}, []string{reps[0].Device(), reps[1].Device(), reps[2].Device()})
	_, err := g.Step(context.Background(), 0)
	require.NoError(t, err)
	assert.Equal(t, 1, a.steps, "the group's own Step is its first replica's")
	require.NoError(t, g.Close())
	assert.Equal(t, [3]int{1, 1, 1}, [3]int{a.closed, b.closed, c.closed}, "Close closes every replica once")
	assert.False(t, g.Healthy())
}

// laned is a replicated program that says its device: a device with lanes.
type laned struct {
	Replicated
	device string
}

func (l laned) Device() string { return l.device }

func TestReplicasOfAPlainProgram(t *testing.T) {
	var p Program = struct{ Program }{&fakeProgram{device: "x"}}
	reps := ReplicasOf(p)
	require.Len(t, reps, 1)
	assert.Empty(t, reps[0].Device(), "a program that does not say where it runs")
}
