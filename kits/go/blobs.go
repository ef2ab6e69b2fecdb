package kit

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Dead-letter reasons of records by reference (PROTOCOL.md section 15.4).
const (
	ReasonBlobMissing  = "blob_missing"
	ReasonBlobTampered = "blob_tampered"
)

// refCodec is the codec chain a record by reference names in saga-codec.
const refCodec = "ref"

// BlobConfig turns on records by reference (docs/large-payloads.md, PROTOCOL.md
// section 15.4): a command whose value is a reference is resolved from the
// engine's blob store before the checks, and a reply whose value is Threshold
// bytes or more goes by reference. The engine's settings are
// SAGA_CODEC__BLOBS__*: give the same keys and store.
type BlobConfig struct {
	// DSN opens a pool on the engine's database (or give Pool, never closed by
	// the kit); Schema is the engine's schema (default "saga_engine"). Its
	// saga_blob_refs rows keep a reply's blob while the saga is kept.
	DSN    string
	Pool   *pgxpool.Pool
	Schema string
	// Directory: the directory store's volume (SAGA_CODEC__BLOBS__STORE=
	// directory); empty, the blobs are rows of saga_blobs (store "postgres").
	Directory string
	// MACKeys are the references' MAC keys by id (SAGA_CODEC__BLOBS__MAC_KEYS;
	// the id "" is the unnamed SAGA_CODEC__BLOBS__MAC_KEY); every key verifies,
	// CurrentKey signs the references of replies.
	MACKeys    map[string][]byte
	CurrentKey string
	// Threshold: a reply's value of this many bytes or more goes by reference
	// (SAGA_CODEC__BLOBS__THRESHOLD_BYTES); 0, replies always go inline.
	Threshold int
	// MaxBytes is the largest blob a reference may name (default 64 MiB).
	MaxBytes int
}

// blobRef is a reference, as the engine's ref codec writes it.
type blobRef struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Store  string `json:"store"`
	Kid    string `json:"kid,omitempty"`
	MAC    string `json:"mac"`
}

type marker struct {
	Codec string `json:"$codec"`
	Data  string `json:"data"`
}

var digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// blobs reads and writes the blobs of records by reference.
type blobs struct {
	cfg      BlobConfig
	pool     *pgxpool.Pool
	ownsPool bool
	store    string // "postgres" or "directory": written into references
	table    string // schema.saga_blobs
	refs     string // schema.saga_blob_refs
}

func newBlobs(cfg BlobConfig) (*blobs, error) {
	if cfg.Schema == "" {
		cfg.Schema = "saga_engine"
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	if len(cfg.MACKeys) == 0 {
		return nil, errors.New("kit: Blobs.MACKeys is empty")
	}
	for id, key := range cfg.MACKeys {
		if len(key) < 16 {
			return nil, fmt.Errorf("kit: Blobs.MACKeys[%q] is %d bytes; 16 or more", id, len(key))
		}
	}
	if _, ok := cfg.MACKeys[cfg.CurrentKey]; !ok {
		return nil, fmt.Errorf("kit: Blobs.CurrentKey %q is not among the MAC keys", cfg.CurrentKey)
	}
	b := &blobs{
		cfg:   cfg,
		pool:  cfg.Pool,
		store: "postgres",
		table: pgx.Identifier{cfg.Schema, "saga_blobs"}.Sanitize(),
		refs:  pgx.Identifier{cfg.Schema, "saga_blob_refs"}.Sanitize(),
	}
	if cfg.Directory != "" {
		b.store = "directory"
	}
	if b.pool == nil {
		if cfg.DSN == "" {
			return nil, errors.New("kit: Blobs needs DSN or Pool (the engine's database)")
		}
		pool, err := pgxpool.New(context.Background(), cfg.DSN)
		if err != nil {
			return nil, fmt.Errorf("kit: blobs: %w", err)
		}
		b.pool, b.ownsPool = pool, true
	}
	return b, nil
}

func (b *blobs) close() {
	if b.ownsPool {
		b.pool.Close()
	}
}

// mac is the MAC a reference must carry; ok is false for a key id not held.
func (b *blobs) mac(r blobRef) (string, bool) {
	key, ok := b.cfg.MACKeys[r.Kid]
	if !ok {
		return "", false
	}
	msg := fmt.Sprintf("%s:%d:%s", r.SHA256, r.Size, r.Store)
	if r.Kid != "" {
		msg = r.Kid + ":" + msg
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return hex.EncodeToString(h.Sum(nil)), true
}

// blobError is a reference that cannot be resolved: its dead-letter reason.
type blobError struct{ reason, detail string }

func (e *blobError) Error() string { return e.reason + ": " + e.detail }

// resolve returns rec with its value resolved when it is a record by
// reference (saga-codec: ref): the inline value, or the blob its reference
// names, verified (MAC, size, content hash). wireSize keeps the record's own
// size for check 1. A *blobError says why it cannot be resolved; another
// error is the store's (wait it out).
func (b *blobs) resolve(ctx context.Context, rec *Record) (*Record, error) {
	hs := lastHeaders(rec.Headers)
	if hs[hCodec] != refCodec || len(rec.Value) > 4096 {
		return rec, nil // another chain (check 8 says so), or too long to be a reference
	}
	var m marker
	if err := json.Unmarshal(rec.Value, &m); err != nil || m.Codec != refCodec {
		return rec, nil // check 8 or 9 says what is wrong
	}
	data, err := base64.StdEncoding.DecodeString(m.Data)
	if err != nil || len(data) == 0 || data[0] > 1 {
		return nil, &blobError{ReasonUndecodable, "saga-codec ref: the marker's data is not a ref codec's output"}
	}
	value := data[1:]
	if data[0] == 1 {
		if value, err = b.fetchVerified(ctx, value); err != nil {
			return nil, err
		}
	}
	out := *rec
	out.Value = value
	out.wireSize = recordSize(rec)
	out.Headers = nil
	for _, h := range rec.Headers {
		if h.Key != hCodec {
			out.Headers = append(out.Headers, h)
		}
	}
	return &out, nil
}

func (b *blobs) fetchVerified(ctx context.Context, raw []byte) ([]byte, error) {
	var r blobRef
	if err := json.Unmarshal(raw, &r); err != nil || !digestPattern.MatchString(r.SHA256) || r.Size < 0 {
		return nil, &blobError{ReasonUndecodable, "ref: the reference is unreadable"}
	}
	want, ok := b.mac(r)
	if !ok {
		return nil, &blobError{ReasonBlobTampered, fmt.Sprintf("the reference to blob sha256:%s names MAC key %q, which this participant does not hold", r.SHA256, r.Kid)}
	}
	if !hmac.Equal([]byte(want), []byte(r.MAC)) {
		return nil, &blobError{ReasonBlobTampered, fmt.Sprintf("the reference to blob sha256:%s does not verify under MAC key %q", r.SHA256, r.Kid)}
	}
	if r.Size > int64(b.cfg.MaxBytes) {
		return nil, &blobError{ReasonBlobTampered, fmt.Sprintf("the reference to blob sha256:%s names %d bytes, over the limit of %d", r.SHA256, r.Size, b.cfg.MaxBytes)}
	}
	blob, found, err := b.get(ctx, r.SHA256)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &blobError{ReasonBlobMissing, fmt.Sprintf("blob sha256:%s (%d bytes, store %q) is not in the blob store: restore it, then replay the record", r.SHA256, r.Size, r.Store)}
	}
	sum := sha256.Sum256(blob)
	if int64(len(blob)) != r.Size || hex.EncodeToString(sum[:]) != r.SHA256 {
		return nil, &blobError{ReasonBlobTampered, fmt.Sprintf("blob sha256:%s in store %q does not hash to its name (%d bytes, %d expected): it was altered", r.SHA256, r.Store, len(blob), r.Size)}
	}
	return blob, nil
}

func (b *blobs) path(digest string) string {
	return filepath.Join(b.cfg.Directory, digest[:2], digest)
}

func (b *blobs) get(ctx context.Context, digest string) ([]byte, bool, error) {
	if b.store == "directory" {
		data, err := os.ReadFile(b.path(digest))
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil
		}
		return data, err == nil, err
	}
	var data []byte
	err := b.pool.QueryRow(ctx, `SELECT data FROM `+b.table+` WHERE digest = $1`, digest).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return data, err == nil, err
}

// seal returns value as it is sent: inline under Threshold, else a reference
// to its blob, kept first with a reference from the saga sagaID (so the
// record never names a missing blob, and the sweeper keeps it while the saga
// is kept). byRef tells whether the value went by reference.
func (b *blobs) seal(ctx context.Context, sagaID string, value []byte) (sealed []byte, byRef bool, err error) {
	if b.cfg.Threshold <= 0 || len(value) < b.cfg.Threshold {
		return value, false, nil
	}
	sum := sha256.Sum256(value)
	r := blobRef{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(value)), Store: b.store, Kid: b.cfg.CurrentKey}
	r.MAC, _ = b.mac(r)
	if err := b.keep(ctx, sagaID, r.SHA256, value); err != nil {
		return nil, false, err
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, false, err
	}
	data := append([]byte{1}, raw...)
	sealed, err = json.Marshal(marker{Codec: refCodec, Data: base64.StdEncoding.EncodeToString(data)})
	return sealed, true, err
}

// keep writes the blob and its reference from the saga, in one transaction
// of the engine's database (a directory's file first, fsynced).
func (b *blobs) keep(ctx context.Context, sagaID, digest string, blob []byte) error {
	if b.store == "directory" {
		if err := writeFileAtomic(b.path(digest), blob); err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if b.store == "postgres" {
			if _, err := tx.Exec(ctx, `INSERT INTO `+b.table+` (digest, data, size) VALUES ($1, $2, $3)
				ON CONFLICT (digest) DO UPDATE SET written_at = now()`, digest, blob, len(blob)); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+b.refs+` (saga_id, digest) VALUES ($1, $2)
			ON CONFLICT DO NOTHING`, sagaID, digest)
		return err
	})
}

func writeFileAtomic(path string, data []byte) error {
	if _, err := os.Stat(path); err == nil {
		now := time.Now()
		return os.Chtimes(path, now, now)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// isRefValue reports whether a stored reply's value is a reference marker
// (it is then sent with saga-codec: ref).
func isRefValue(value []byte) bool {
	return bytes.HasPrefix(value, []byte(`{"$codec":"ref"`))
}

// recordSize is a record's size as check 1 counts it.
func recordSize(rec *Record) int {
	if rec.wireSize > 0 {
		return rec.wireSize
	}
	size := len(rec.Value)
	for _, h := range rec.Headers {
		size += len(h.Key) + len(h.Value)
	}
	return size
}
