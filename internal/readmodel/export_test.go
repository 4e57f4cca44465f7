package readmodel

import (
	"maps"
	"slices"
)

// QueryNames lists the queries of queries.sql; QueryText returns one (tests only).
func QueryNames() []string         { return slices.Collect(maps.Keys(queries)) }
func QueryText(name string) string { return query(name) }
