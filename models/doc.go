// Package models owns the model repository: the on-disk layout
// (models/<name>/model.yaml + weights.safetensors), the model.yaml schema and
// its validation, the safetensors reader and writer, and the architectures
// (mlp) that turn a file of named tensors into typed layers.
//
// It imports only bucketing, whose rules check model.yaml's bucket lists; it
// knows nothing of HTTP, batching or engines. The batching keys it parses
// but does not range-check: they are overrides of the server's batching
// policy, checked by batching once merged. Engines read a [Model] and build
// their own programs from it.
//
// # Repository layout
//
//	models/
//	  digits/
//	    model.yaml
//	    weights.safetensors
//
// Every error names the file and the key or tensor that is wrong, and what
// was expected, so that a start-up failure can be fixed without reading code.
package models
