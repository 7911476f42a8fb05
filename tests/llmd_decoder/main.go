// Decodes KV-event payloads the way llm-d's vLLM adapter does: the batch and each event are
// msgpack arrays read into Go structs by position (vmihailenco/msgpack v5, ",array"), events
// dispatched on their first element, hashes taken as uint64 (or the last 8 bytes of a byte
// string). Reads one hex payload per line on stdin and writes one JSON batch per line, so
// that tests/test_kv_events.py can hold pagode's bytes to a Go reader of llm-d's shape.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"github.com/vmihailenco/msgpack/v5"
)

type batch struct {
	_      struct{} `msgpack:",array"`
	TS     float64
	Events []msgpack.RawMessage
	Rank   *int `msgpack:",omitempty"`
}

type stored struct {
	_           struct{} `msgpack:",array"`
	Tag         string
	BlockHashes []any
	Parent      any
	TokenIDs    []uint32
	BlockSize   int
	LoraID      *int    `msgpack:",omitempty"`
	Medium      *string `msgpack:",omitempty"`
	LoraName    *string `msgpack:",omitempty"`
}

type removed struct {
	_           struct{} `msgpack:",array"`
	Tag         string
	BlockHashes []any
	Medium      *string `msgpack:",omitempty"`
}

func toUint64(raw any) uint64 {
	switch v := raw.(type) {
	case uint64:
		return v
	case int64:
		return uint64(v)
	case []byte:
		padded := make([]byte, 8)
		copy(padded[max(0, 8-len(v)):], v[max(0, len(v)-8):])
		return binary.BigEndian.Uint64(padded)
	}
	panic(fmt.Sprintf("unsupported hash %T", raw))
}

func max(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func hashes(raw []any) []uint64 {
	out := []uint64{}
	for _, h := range raw {
		out = append(out, toUint64(h))
	}
	return out
}

func decodeEvent(raw []byte) map[string]any {
	var head []any
	must(msgpack.Unmarshal(raw, &head))
	switch head[0].(string) {
	case "BlockStored":
		var e stored
		must(msgpack.Unmarshal(raw, &e))
		var parent *uint64
		if e.Parent != nil {
			p := toUint64(e.Parent)
			parent = &p
		}
		return map[string]any{"type": e.Tag, "hashes": hashes(e.BlockHashes), "parent": parent,
			"token_ids": e.TokenIDs, "block_size": e.BlockSize, "lora_id": e.LoraID, "medium": e.Medium,
			"lora_name": e.LoraName}
	case "BlockRemoved":
		var e removed
		must(msgpack.Unmarshal(raw, &e))
		return map[string]any{"type": e.Tag, "hashes": hashes(e.BlockHashes), "medium": e.Medium}
	case "AllBlocksCleared":
		return map[string]any{"type": "AllBlocksCleared"}
	}
	panic(fmt.Sprintf("unknown event %v", head[0]))
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 1<<26)
	out := json.NewEncoder(os.Stdout)
	for lines.Scan() {
		payload, err := hex.DecodeString(lines.Text())
		must(err)
		var b batch
		must(msgpack.Unmarshal(payload, &b))
		events := []map[string]any{}
		for _, raw := range b.Events {
			events = append(events, decodeEvent(raw))
		}
		must(out.Encode(map[string]any{"ts": b.TS, "rank": b.Rank, "events": events}))
	}
	must(lines.Err())
}
