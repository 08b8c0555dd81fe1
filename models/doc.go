// Package models owns what a model is: the model repository's on-disk layout
// (<repository>/<name>/model.yaml, weights.safetensors, an optional vocab.txt), the
// model.yaml schema and its validation, the loaders, the safetensors reader
// and writer, the WordPiece tokenizer, and the architectures (mlp and
// encoder) that turn a file of named tensors into typed layers.
//
// It also owns input preparation: [Model.PrepareInputs] turns a request's
// decoded inputs into the model's step inputs (tokenizing text,
// range-checking token ids, masks and types), and [Config.StepInputs]
// states, once for every architecture, which tensors a step takes and in
// what order. The server and both engines take them from here.
//
// It imports only bucketing, whose rules check model.yaml's bucket lists; it
// knows nothing of HTTP or any other protocol, of batching, or of engines.
// The batching keys it parses but does not range-check: they are overrides
// of the server's batching policy, checked by batching once merged. Engines
// read a [Model] and build their own programs from it; protocols hand it
// decoded [Input]s and answer an error matching [ErrInput] as the client's.
//
// # Repository layout
//
//	models/
//	  digits/
//	    model.yaml
//	    weights.safetensors
//	  tiny-encoder/
//	    model.yaml
//	    weights.safetensors
//	    vocab.txt
//
// Every error names the file and the key or tensor that is wrong, and what
// was expected, so that a start-up failure can be fixed without reading code.
package models
