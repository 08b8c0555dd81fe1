// Package models owns what a model is: the model repository's on-disk layout
// (models/<name>/model.yaml, weights.safetensors, an optional vocab.txt), the
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
// It is a leaf: it knows nothing of HTTP or any other protocol, of
// batching, or of engines. Engines read a [Model] and build their own
// programs from it; protocols hand it decoded [Input]s and answer an error
// matching [ErrInput] as the client's.
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
