package core

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBudgetWaitsForBytesGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewBudget(100)
		require.True(t, b.TryTake(60))
		require.False(t, b.TryTake(50), "60 + 50 is over 100")

		got := make(chan error, 1)
		go func() { got <- b.wait(context.Background(), 50, time.Second) }()
		synctest.Wait()
		select {
		case err := <-got:
			t.Fatalf("took 50 of the 40 free: %v", err)
		default:
		}
		b.Give(60)
		require.NoError(t, <-got, "the waiter takes what was given back")
		assert.Equal(t, int64(50), b.used.Load())

		start := time.Now()
		assert.ErrorIs(t, b.wait(context.Background(), 60, time.Second), errBudgetBusy)
		assert.Equal(t, time.Second, time.Since(start), "a waiter gives up after its wait")
		assert.Equal(t, int64(50), b.used.Load(), "a waiter that gave up holds nothing")

		ctx, cancel := context.WithCancel(context.Background())
		go func() { got <- b.wait(ctx, 60, time.Hour) }()
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-got, context.Canceled, "a client that went away stops waiting")
		assert.Zero(t, b.waiting.Load())
	})
}

func TestChargeAnswers413Or503(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewBudget(10 << 20)
		c := Charge{Budget: b, Wait: time.Second}
		require.NoError(t, c.Take(context.Background(), 4<<20, "the request"))
		require.NoError(t, c.Take(context.Background(), 0, "the request"))

		err := c.Take(context.Background(), 7<<20, "the request")
		assert.Equal(t, http.StatusRequestEntityTooLarge, StatusOf(err))
		assert.EqualError(t, err, "the request would take about 11 MiB of memory, more than the server's whole in-flight budget of 10 MiB (server.max_inflight_bytes); send a smaller request")

		other := Charge{Budget: b, Wait: time.Second}
		require.NoError(t, other.Take(context.Background(), 5<<20, "the request"))
		err = c.Take(context.Background(), 2<<20, "the request body")
		assert.Equal(t, http.StatusServiceUnavailable, StatusOf(err))
		assert.EqualError(t, err, "the server is busy: requests in flight hold 9 MiB of its 10 MiB in-flight budget (server.max_inflight_bytes), and the request body needs 2 MiB more; retry")

		other.Release()
		c.Release()
		c.Release()
		assert.Zero(t, b.used.Load())
	})
}
