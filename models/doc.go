// Package models owns what a model is: the model repository's on-disk
// layouts, the model.yaml schema and its validation, the loaders, the
// safetensors reader and writer, the tokenizers (WordPiece for vocab.txt
// folders, and any tokenizer.json through [models/tokenizers]), and the
// architectures (mlp, encoder, torch) that turn a file of named tensors
// into typed layers, or hand a PyTorch module to the worker.
//
// It also owns input preparation: [Model.PrepareInputs] turns a request's
// decoded inputs into the model's step inputs (tokenizing text,
// range-checking token ids, masks and types), and [Config.StepInputs]
// states, once for every architecture, which tensors a step takes and in
// what order. serving and both engines take them from here; the text
// models' tensor names ([TextInput], [EmbeddingOutput], ...) are declared
// here for the protocols that look for them.
//
// It imports bucketing (whose rules check model.yaml's bucket lists),
// models/tokenizers, and internal helpers (clip, half); it knows nothing of
// HTTP or any other protocol, of batching, or of engines. The batching
// keys it parses but does not range-check: they are overrides of the
// server's batching policy, checked by batching once merged. Engines read
// a [Model] and build their own programs from it; protocols hand it
// decoded [Input]s and answer an error matching [ErrInput] as the client's.
//
// # Repository layout
//
// Each directory of the repository is one model, in one of two layouts:
//
//	model_repository/
//	  digits/                 stepserve's own: model.yaml names the architecture
//	    model.yaml
//	    weights.safetensors
//	  tiny-encoder/
//	    model.yaml
//	    weights.safetensors
//	    vocab.txt
//	  tiny-xlmr/              a Hugging Face Hub folder, as downloaded
//	    config.json           (model_type, hidden sizes, labels)
//	    tokenizer.json
//	    model.safetensors     (or sharded, with model.safetensors.index.json)
//	    model.yaml            optional: buckets, engine, overrides
//
// A Hub folder's family (BERT, RoBERTa, XLM-R, CamemBERT, DistilBERT) and
// head (embeddings, sequence classification, rerankers) come from its
// config.json and tensor names (hf.go); its signature is the text
// models' (a BYTES "text", with "text_pair" for pair scorers).
//
// Every error names the file and the key or tensor that is wrong, and what
// was expected, so that a start-up failure can be fixed without reading code.
package models
