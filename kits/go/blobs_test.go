package kit

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
)

// The MACs the engine's ref codec makes (saga_engine/core/history/_blobref.py)
// for the blob "a blob", under key id k1 and under the unnamed key.
const (
	vectorDigest   = "5570a3cf02207f1d352d2cfea385be4bc0b2b9414f606baa6f55db60b232f221"
	vectorMACk1    = "6bbd9dd91473eb9e75a31dc37d7d3b6732799e7b518ae10644994a53471ae942"
	vectorMACnamed = "dc9b3c99c7a5c3aa92334dc8aac3fd3e1631dbe9df347b19ac6750de5c294112"
)

func testBlobs(t *testing.T, dir string) *blobs {
	t.Helper()
	b, err := newBlobs(BlobConfig{
		Pool:       nil,
		DSN:        "postgres://unused@127.0.0.1:1/x", // never connected in these tests
		Directory:  dir,
		MACKeys:    map[string][]byte{"k1": bytes.Repeat([]byte("k"), 32), "": bytes.Repeat([]byte("u"), 32)},
		CurrentKey: "k1",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	return b
}

func TestBlobMACsMatchTheEngines(t *testing.T) {
	b := testBlobs(t, t.TempDir())
	for kid, want := range map[string]string{"k1": vectorMACk1, "": vectorMACnamed} {
		got, ok := b.mac(blobRef{SHA256: vectorDigest, Size: 6, Store: "postgres", Kid: kid})
		if !ok || got != want {
			t.Errorf("kid %q: mac %s, want %s", kid, got, want)
		}
	}
	if _, ok := b.mac(blobRef{SHA256: vectorDigest, Size: 6, Store: "postgres", Kid: "gone"}); ok {
		t.Error("a key id not held gave a MAC")
	}
}

func refRecord(t *testing.T, ref blobRef) *Record {
	t.Helper()
	raw, _ := json.Marshal(ref)
	value, _ := json.Marshal(marker{Codec: refCodec, Data: base64.StdEncoding.EncodeToString(append([]byte{1}, raw...))})
	return &Record{Value: value, Headers: []Header{{Key: hCodec, Value: []byte(refCodec)}, {Key: hType, Value: []byte("saga.command")}}}
}

func TestAReferenceResolvesFromTheDirectoryStore(t *testing.T) {
	dir := t.TempDir()
	b := testBlobs(t, dir)
	if err := writeFileAtomic(b.path(vectorDigest), []byte("a blob")); err != nil {
		t.Fatal(err)
	}
	r := blobRef{SHA256: vectorDigest, Size: 6, Store: "directory", Kid: "k1"}
	r.MAC, _ = b.mac(r)
	rec := refRecord(t, r)
	out, err := b.resolve(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Value) != "a blob" || out.wireSize != recordSize(rec) {
		t.Fatalf("resolved %q (wire size %d)", out.Value, out.wireSize)
	}
	for _, h := range out.Headers {
		if h.Key == hCodec {
			t.Fatal("the saga-codec header is kept on the resolved record")
		}
	}
}

func TestHostileReferencesGiveTheirReasons(t *testing.T) {
	dir := t.TempDir()
	b := testBlobs(t, dir)
	signed := func(r blobRef) blobRef { r.MAC, _ = b.mac(r); return r }
	if err := writeFileAtomic(b.path(vectorDigest), []byte("a blob, altered")); err != nil {
		t.Fatal(err)
	}
	missing := "0000000000000000000000000000000000000000000000000000000000000000"
	cases := map[string]struct {
		ref    blobRef
		reason string
	}{
		"forged":    {blobRef{SHA256: vectorDigest, Size: 6, Store: "directory", Kid: "k1", MAC: vectorMACk1}, ReasonBlobTampered},
		"unknown":   {blobRef{SHA256: vectorDigest, Size: 6, Store: "directory", Kid: "gone", MAC: "00"}, ReasonBlobTampered},
		"missing":   {signed(blobRef{SHA256: missing, Size: 6, Store: "directory", Kid: "k1"}), ReasonBlobMissing},
		"tampered":  {signed(blobRef{SHA256: vectorDigest, Size: 6, Store: "directory", Kid: "k1"}), ReasonBlobTampered},
		"too large": {signed(blobRef{SHA256: vectorDigest, Size: 1 << 40, Store: "directory", Kid: "k1"}), ReasonBlobTampered},
	}
	for name, c := range cases {
		_, err := b.resolve(context.Background(), refRecord(t, c.ref))
		var be *blobError
		if !errors.As(err, &be) || be.reason != c.reason {
			t.Errorf("%s: %v, want %s", name, err, c.reason)
		}
	}
}

func TestAnInlineValueUnderTheRefCodecIsUnwrapped(t *testing.T) {
	b := testBlobs(t, t.TempDir())
	value, _ := json.Marshal(marker{Codec: refCodec, Data: base64.StdEncoding.EncodeToString(append([]byte{0}, `{"a":1}`...))})
	out, err := b.resolve(context.Background(), &Record{Value: value, Headers: []Header{{Key: hCodec, Value: []byte(refCodec)}}})
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Value) != `{"a":1}` {
		t.Fatalf("%q", out.Value)
	}
}
