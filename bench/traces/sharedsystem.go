package traces

import "fmt"

// SharedSystem is many tenants sharing a few system prompts: 6 system prompts of
// 1,000–2,500 tokens chosen with Zipf popularity (s = 1.1) by 200 tenants (each
// tenant always uses the same one); each request is single-turn: the tenant's
// system prompt plus a unique user message of 50–400 tokens, 50–250 output
// tokens. Poisson arrivals at Rate.
func SharedSystem(o Options) Trace {
	rng := newRNG(o.Seed)
	const nSystems, nTenants = 6, 200
	systems := make([][]uint32, nSystems)
	for i := range systems {
		systems[i] = tokens(rng, between(rng, 1000, 2500))
	}
	tenantSystem := make([]int, nTenants)
	for i := range tenantSystem {
		tenantSystem[i] = zipf(rng, nSystems, 1.1)
	}
	reqs := make([]Request, 0, o.Requests)
	at := expDuration(rng, 1/o.Rate)
	for i := range o.Requests {
		tenant := rng.IntN(nTenants)
		sys := tenantSystem[tenant]
		reqs = append(reqs, Request{
			Arrival: at, Session: fmt.Sprintf("tenant-%d-%d", tenant, i), Prefix: fmt.Sprintf("system-%d", sys),
			Prompt: concat(systems[sys], tokens(rng, between(rng, 50, 400))), OutputTokens: between(rng, 50, 250),
		})
		at += expDuration(rng, 1/o.Rate)
	}
	return finish("shared-system", reqs, o.Requests)
}
