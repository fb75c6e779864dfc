// The accept backlog of the server's listening socket (Linux). Debian's compiled cpp-httplib 0.11 listens with a
// backlog of 5, so a burst of more simultaneous connects than that can be dropped before the accept loop takes them;
// this finds the listening socket of `port` among the process's descriptors (/proc/self/fd, SO_ACCEPTCONN and
// getsockname) and calls listen() on it again with `backlog`, which Linux applies to a listening socket.
#pragma once

namespace dsv4 {

// Returns the number of listening sockets adjusted (0 when none was found; the server then keeps working with the
// library's backlog).
int raise_listen_backlog(int port, int backlog);

}  // namespace dsv4
