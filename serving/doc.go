// Package serving owns the live model set: the models a server is serving
// right now, each loaded on its engine, warmed up, behind its batcher.
//
// A [Set] loads models from the model repository directory with a context
// that a load request, the load timeout or a shutdown can cancel, after
// checking what each will take (model.yaml, the weights' shapes, its
// estimated memory against a limit) before its weights are read; a panic
// in a load is that load's error. It compiles and warms up every
// bucket before a model counts as ready, reloads a model by warming up the
// new one before it takes over, and unloads a model after its queue has
// drained. It chooses each model's engine from an injected registry
// ([Engine]), so tests run it on fakes; runs a model loaded as several
// replicas (model.yaml's instances) with a runner per replica, each batch
// on the least-loaded healthy one, as many batches at once as replicas,
// and a batch whose replica's device went away once more on another; and
// composes failover to a second engine while no replica's device is up.
// It exports the load and failover metrics, stepserve_model_ready and the
// replica gauges (stepserve_model_replicas, ..._healthy).
//
// It knows nothing of HTTP: the server asks it for models by name and maps
// its errors ([ErrUnknownModel], [ErrBadModel], [ErrStopping]) to status
// codes. It never
// reads the server's configuration; the caller passes [Options].
//
// # Lifetime of a model
//
//	LoadAll/Load  engine.Load: weights resident, staging allocated   LOADING
//	Warmup        every bucket compiled and run twice, on every       READY
//	              replica
//	device down   served by the other replicas; not ready below
//	              instances.min_ready healthy ones, unless the
//	              failover engine serves it
//	Unload        no longer found by name; queue drained; closed     (gone)
//	              once no step runs on it
package serving
