// Package pgcluster runs a local PostgreSQL cluster with the machine's own initdb, pg_ctl and postgres, for the
// tests (a throwaway cluster) and for `scheduler demo` (a persistent one); and a PgBouncer in front of a server
// (StartPgBouncer), for the tests and benchmarks of stepready behind a transaction pooler.
//
// The binaries are found in PATH or /usr/lib/postgresql/*/bin, newest major version first (15 or newer). The
// server listens on 127.0.0.1 on a free port with trust authentication for the superuser postgres, and keeps
// its Unix sockets in its data directory, so it never touches /var/run/postgresql. PostgreSQL refuses to run as
// root: when this process is root, initdb, pg_ctl and postgres run as the postgres system user, else nobody.
//
// # Throwaway clusters
//
// StartThrowaway initialises a cluster in a new temporary directory and runs postgres as a child process that
// dies with this one (parent-death signal). Stop shuts it down and deletes the directory; directories left by a
// process that was killed are deleted by the next StartThrowaway.
//
// # Persistent clusters
//
// StartPersistent keeps a cluster in a directory of the caller's choosing (`.stepready/` in a clone) across
// runs. Its states and transitions:
//
//	(no directory) ──StartPersistent: initdb, pg_ctl start──────────────────────▶ running
//	stopped        ──StartPersistent: pg_ctl start (on the recorded port if free)──▶ running
//	running        ──StartPersistent: reused as is (Started = false)──────────────▶ running
//	running        ──Stop: pg_ctl stop -m fast, unless other clients are connected──▶ stopped
//
// The directory holds cluster.json (the data directory and the port, reused on the next start when still free),
// data/ (PGDATA) and postgres.log. The server is started with pg_ctl, so it is not a child of this process: a
// server that is already running (postmaster.pid names a live process that accepts connections) is reused.
// Stop shuts the server down with `pg_ctl stop -m fast` unless another client is connected to it (a second
// demo, a psql session), in which case it is left running for them and the next StartPersistent reuses it.
//
// When this process is root and the server user cannot enter the directory (a clone under /root, which is
// mode 0700), the data directory and log go to /var/tmp/stepready-cluster-<hash of the directory>/ instead, and
// cluster.json in the directory points there.
package pgcluster
