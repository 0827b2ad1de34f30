// Slurm host-list expansion (the syntax of SLURM_JOB_NODELIST), so the launcher can find the
// rendezvous host and map ranks to nodes without shelling out to `scontrol show hostnames`.
#pragma once
#include <string>
#include <vector>

namespace me::launch {

// Expands a Slurm host list into host names, in Slurm's order.
//   "p5-[001-004,007],head"  -> p5-001 p5-002 p5-003 p5-004 p5-007 head
//   "rack[1-2]-node[01-02]"  -> rack1-node01 rack1-node02 rack2-node01 rack2-node02
// Top-level commas separate entries; commas inside brackets separate range items. Several
// bracket groups in one entry form a cartesian product with the leftmost group outermost.
// A range keeps the zero padding given by the width of its lower bound ("08-11" -> 08..11,
// "9-11" -> 9,10,11). Throws me::Error quoting the spec on malformed input.
std::vector<std::string> expand_hostlist(const std::string& spec);

// The first host of the list: by convention the rendezvous (master) address.
std::string first_host(const std::string& spec);

}  // namespace me::launch
