#!/bin/sh
# controller.sh: the controller loop of docs/guide.md ("A controller loop"), run by
# e2e/controller_test.go through a real ssh client and sshd.
#
# usage: controller.sh RUN_ID LEASE_SECONDS RENEW_FOR_SECONDS
#   Starts `sleep 300` as run RUN_ID with a LEASE_SECONDS lease, renews the
#   lease every second for RENEW_FOR_SECONDS (more than the lease, to prove the
#   renewals are what keeps it alive), then stops renewing (as a controller
#   that crashed or lost interest would) and asks reconcile until the run is
#   decided. Each renewal's ssh round trip must stay well inside the lease.
# env:
#   SSH  the ssh command up to the destination, split on spaces
#        (for example "ssh build-host-7"); required
#   AW   the remote agent-wrap command line, default "agent-wrap"
#        (for example "/usr/local/bin/agent-wrap --root /srv/agent-runs")
# exit: 0 when every step behaved as documented, 1 otherwise, saying which.
set -u
id=$1 lease=$2 renew_for=$3
aw=${AW:-agent-wrap}

say() { echo "controller: $*"; }
fail() { echo "controller: FAIL: $*" >&2; exit 1; }
# on runs one agent-wrap command on the host over a new ssh connection.
on() { $SSH "$aw $*"; }

# 1. Start the job under a lease. The connection streams the job's output
#    and ends with the run's exit code; run it in the background.
on run --lease "${lease}s" "$id" -- sleep 300 >/dev/null 2>&1 &
stream=$!

# 2. Wait until it runs: reconcile exits 3 while a run is running
#    (66 before the ID is claimed).
tries=0
while :; do
	on reconcile "$id" >/dev/null 2>&1
	rc=$?
	[ "$rc" -eq 3 ] && break
	tries=$((tries + 1))
	[ "$tries" -lt 50 ] || fail "run never reported running (reconcile exit $rc)"
	sleep 0.2
done
say "running"

# 3. Keep it alive: each renew sets the deadline to now + the run's lease.
start=$(date +%s)
renewals=0
while [ $(($(date +%s) - start)) -lt "$renew_for" ]; do
	on renew "$id" || fail "renewal $((renewals + 1)) refused"
	renewals=$((renewals + 1))
	sleep 1
done
on reconcile "$id" >/dev/null 2>&1
rc=$?
[ "$rc" -eq 3 ] || fail "after $renewals renewals reconcile exits $rc, want 3 (running)"
elapsed=$(($(date +%s) - start))
[ "$elapsed" -gt "$lease" ] || fail "renewals took ${elapsed}s, not longer than the ${lease}s lease: proves nothing"
say "renewed $renewals times; still running ${elapsed}s later, past its ${lease}s lease"

# 4. Stop renewing. Within the lease plus the grace the run is stopped;
#    reconcile then exits 0 with outcome cancelled.
tries=0
while :; do
	verdict=$(on reconcile --json "$id" 2>/dev/null)
	rc=$?
	[ "$rc" -ne 3 ] && break
	tries=$((tries + 1))
	[ "$tries" -lt 60 ] || fail "still running long after the renewals stopped"
	sleep 0.5
done
[ "$rc" -eq 0 ] || fail "reconcile exits $rc: $verdict"
echo "$verdict" | grep -Eq '"outcome": *"cancelled"' || fail "verdict: $verdict"
say "reconcile: $verdict"

# 5. An expired lease is never revived.
if on renew "$id" 2>/dev/null; then
	fail "renew after the lease expired succeeded"
fi
say "renew after expiry refused"

# 6. The streaming connection ended as run does when the lease expires: 124.
wait "$stream"
rc=$?
[ "$rc" -eq 124 ] || fail "the run's connection exited $rc, want 124"

# 7. A controller that lost that connection learns the same from wait.
on wait "$id"
rc=$?
[ "$rc" -eq 124 ] || fail "wait exits $rc, want 124"
say "ok: lease expired, run cancelled, exit 124"
