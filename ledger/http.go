package ledger

// HTTPGateway is one of a run's HTTP credential gateways as the ledger
// records it: what the job could reach and how, never the secret (which
// the controller sent over the launch connection and forgot).
type HTTPGateway struct {
	Name     string   `json:"name"`
	Upstream string   `json:"upstream"` // https://HOST[:PORT][/PREFIX], no user, query or fragment
	Methods  []string `json:"methods"`  // the methods forwarded; ["*"]: all but CONNECT and TRACE
	Secret   bool     `json:"secret"`   // a credential is added (false: a policy-only gateway)
}
