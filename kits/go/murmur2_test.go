package kit

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The partition vectors of PROTOCOL.md section 2 (Kafka's Java murmur2).
func TestMurmur2PartitionVectors(t *testing.T) {
	vectors := []struct {
		key         string
		p3, p8, p12 int
	}{
		{"saga-1", 1, 5, 1},
		{"saga-2", 0, 6, 6},
		{"transfer-7", 0, 7, 3},
		{"6eb4c397-22ce-53a6-b3f5-5e342aecbc8b", 2, 3, 11},
	}
	p := recordPartitioner().ForTopic("saga.inbox")
	for _, v := range vectors {
		for n, want := range map[int]int{3: v.p3, 8: v.p8, 12: v.p12} {
			// A keyed record must go to the same partition every time.
			for range 3 {
				if got := p.Partition(&kgo.Record{Key: []byte(v.key)}, n); got != want {
					t.Errorf("%s over %d partitions: %d, want %d", v.key, n, got, want)
				}
			}
		}
	}
}
