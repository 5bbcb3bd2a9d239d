#!/bin/bash
# Two "hosts" on this machine: network namespaces NAME_a and NAME_b joined by a veth link (10.77.X.1 and 10.77.X.2),
# optionally shaped with a tc qdisc on both ends, and an rsh agent that runs a command "on" a host by entering its namespace.
#   netns_hosts.sh up NAME SUBNET [qdisc args...]   e.g. up kiln1 77 tbf rate 1gbit burst 256kb latency 10ms
#                                                   or  up kiln1 77 netem delay 100us rate 1gbit (kernels with sch_netem)
#   netns_hosts.sh down NAME
#   netns_hosts.sh rsh HOST_IP command...           (mpirun's --mca plm_rsh_agent; finds the namespace by address)
set -e
cmd=$1
shift
case "$cmd" in
  up)
    name=$1 net=$2
    shift 2
    ip netns add "${name}_a"
    trap 'ip netns del "${name}_a" 2>/dev/null; ip netns del "${name}_b" 2>/dev/null' ERR  # no half-made hosts left
    ip netns add "${name}_b"
    ip link add "${name}a" type veth peer name "${name}b"
    ip link set "${name}a" netns "${name}_a"
    ip link set "${name}b" netns "${name}_b"
    ip -n "${name}_a" addr add "10.${net}.0.1/24" dev "${name}a"
    ip -n "${name}_b" addr add "10.${net}.0.2/24" dev "${name}b"
    for s in a b; do
      ip -n "${name}_$s" link set lo up
      ip -n "${name}_$s" link set "${name}$s" up
      if [ $# -gt 0 ]; then ip netns exec "${name}_$s" tc qdisc add dev "${name}$s" root "$@"; fi
    done
    ;;
  down)
    name=$1
    ip netns del "${name}_a" 2>/dev/null || true
    ip netns del "${name}_b" 2>/dev/null || true
    ;;
  rsh)
    host=$1
    shift
    # Skip ssh-style options mpirun may pass before the host (none with plm_rsh_agent set to this script).
    for ns in $(ip netns list | awk '{print $1}'); do
      if ip -n "$ns" -4 addr show 2>/dev/null | grep -q "inet $host/"; then
        exec ip netns exec "$ns" /bin/sh -c "$*"
      fi
    done
    echo "netns_hosts.sh rsh: no network namespace has the address $host" >&2
    exit 255
    ;;
  *)
    echo "usage: netns_hosts.sh up NAME SUBNET [netem args] | down NAME | rsh HOST command..." >&2
    exit 2
    ;;
esac
