// Package wire is the inference request every door decodes into: OIP's
// tensors (JSON, Triton's binary-tensor extension, gRPC's typed and raw
// contents) parsed and checked against the model's signature and the
// wire limits before any of them is built ([ParseRequest],
// [CheckRequest]); what the request will cost, bounded from its declared
// shapes ([Footprint]); classification outputs; tensors that lie in
// shared memory; and the parameters of a generation. It refuses with
// apierr.Errors that name the input or field at fault, and knows neither
// the budget nor the doors: the core's call charges the footprint and
// runs the request.
package wire
