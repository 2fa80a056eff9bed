package engine

// Kind is what a resource chime provisions is to its users: every one of
// them is a JetStream stream underneath.
type Kind string

// The kinds of resources.
const (
	KindStream      Kind = "stream"
	KindBucket      Kind = "kv"
	KindObjectStore Kind = "object"
)

// Resource is one stream, KV bucket or object store chime provisions.
type Resource struct {
	Kind Kind
	// Name is the bucket's or store's name, or the stream's.
	Name string
	// Stream is the JetStream stream that holds it: KV_<bucket>,
	// OBJ_<store>, or Name for a stream.
	Stream      string
	Description string
	// Transient is why a resource needs no backup (its entries expire in
	// seconds or minutes and chime writes them anew); "" when it does.
	Transient string
}

// Inventory is every stream, KV bucket and object store Provision makes
// for t, in the order a restore takes them: the buckets and stores that
// hold records first, then the streams that refer to them. It is read from
// the same configurations Provision uses, so a resource added there is
// listed here (engine's tests compare it with a provisioned server's
// streams).
func Inventory(t Topology) []Resource {
	var out []Resource
	for _, c := range buckets(t) {
		r := Resource{Kind: KindBucket, Name: c.Bucket, Stream: "KV_" + c.Bucket, Description: c.Description}
		switch c.Bucket {
		case LeasesBucket:
			r.Transient = "leases and presence expire after the lease TTL and are taken anew"
		case SessionsBucket:
			r.Transient = "the connections of the servers of the backup; they end with those servers"
		}
		out = append(out, r)
	}
	for _, c := range objectStores(t) {
		out = append(out, Resource{Kind: KindObjectStore, Name: c.Bucket, Stream: "OBJ_" + c.Bucket, Description: c.Description})
	}
	for _, c := range streams(t) {
		out = append(out, Resource{Kind: KindStream, Name: c.Name, Stream: c.Name, Description: c.Description})
	}
	return out
}
