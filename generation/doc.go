// Package generation schedules autoregressive generation over a paged KV
// cache: which sequences run in the next step, and what each computes.
//
// A decoder model's KV cache lives on the device, allocated once per
// replica as blocks of BlockSize tokens ([BlockPool]); a sequence holds the
// blocks its tokens fill. Each step of the model is one of two kinds of
// work, possibly both at once: prefill (a chunk of a prompt's tokens,
// whose keys and values go into the cache) and decode (one new token for
// each running sequence). The [Scheduler] decides, before every step,
// continuously:
//
//   - running sequences decode one token each, up to Options.MaxNumSeqs;
//   - waiting ones join between two steps, by priority then arrival, as
//     their prompts' chunks fit the step's token budget
//     (Options.MaxBatchTokens, decodes counted first, so that a long
//     prompt cannot stall the streams already running: it is prefilled a
//     chunk a step) and the pool's free blocks;
//   - when a running sequence needs a block and none is free, the newest
//     running sequence is preempted: its blocks are freed and it waits at
//     the head of the queue, to be prefilled again (prompt and the tokens
//     it had produced) when there is room, its output unchanged;
//   - a sequence that finishes (an end-of-sequence token, max_tokens, the
//     model's length) or is cancelled gives its blocks back at once;
//   - with Options.PromptLookup, a decoding sequence may compute a draft
//     after its last token, from what the decodes leave of the budget
//     and the free blocks (never by preempting): the tokens that followed
//     its last n-gram earlier in it, kept by Advance while the model drew
//     them too (lookup.go).
//
// The scheduler is plain state: it runs no goroutine and takes no lock.
// The loop that owns a model's steps calls Schedule, runs the step, and
// reports each sequence's new token with Advance.
package generation
