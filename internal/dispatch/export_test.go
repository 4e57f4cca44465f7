package dispatch

import "time"

// WithFetchCooldown returns cfg with River's FetchCooldown set to d (a test can make River's own insert
// announcements rare).
func WithFetchCooldown(cfg RiverConfig, d time.Duration) RiverConfig {
	cfg.fetchCooldown = d
	return cfg
}

// WithoutRowCheck returns cfg with the claimed rows left unchecked before their jobs are inserted, so that River
// itself refuses a job with a bad queue (the fallback of Dispatch is then what fails the step).
func WithoutRowCheck(cfg RiverConfig) RiverConfig {
	cfg.skipCheck = true
	return cfg
}

// WithClaimQueues returns cfg whose claims take steps of queues instead of cfg.Queues (River's client still works
// cfg.Queues): a claim can then hold a step whose queue River refuses.
func WithClaimQueues(cfg RiverConfig, queues ...string) RiverConfig {
	cfg.claimQueues = queues
	return cfg
}
