// A TCP port for the rendezvous store of a local launch (megaengine --nproc N).
#pragma once
#include <string>
#include <utility>

namespace me::launch {

// A port on `addr` that nothing is bound to now: preferably a random one below the kernel's
// ephemeral range, else one the kernel picks (bind to port 0). Checked by binding it, then
// closed: another process could take it before the ranks bind it (torchrun has the same race).
// Below the ephemeral range no outgoing connection is given it as its source port; in the
// range, a rank retrying its connection to the store before the store listens can be handed the
// store's own port (a TCP self-connection), and the store then fails with EADDRINUSE.
// Throws me::Error naming the address when nothing can be bound.
int pick_free_port(const std::string& addr);

// The kernel's ephemeral port range [first, last] (/proc/sys/net/ipv4/ip_local_port_range;
// Linux's default where that cannot be read).
std::pair<int, int> ephemeral_port_range();

}  // namespace me::launch
