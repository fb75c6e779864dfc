#include "server/connection_monitor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "server/http_transport.h"

namespace dsv4 {

namespace {

// Port and textual address of a sockaddr (IPv4 or IPv6); port -1 if unsupported.
int addr_port(const sockaddr_storage& ss, std::string* addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (addr) *addr = inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf) ? buf : "";
    return ntohs(a->sin_port);
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (addr) *addr = inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf) ? buf : "";
    return ntohs(a->sin6_port);
  }
  return -1;
}

bool matches(int fd, const std::string* remote_addr, int remote_port, int local_port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 || addr_port(ss, nullptr) != local_port)
    return false;
  len = sizeof ss;
  std::string peer;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  if (addr_port(ss, &peer) != remote_port) return false;
  return !remote_addr || peer == *remote_addr || peer == "::ffff:" + *remote_addr;
}

}  // namespace

ConnectionMonitor::ConnectionMonitor(const std::string& remote_addr, int remote_port, int local_port)
    : remote_port_(remote_port), local_port_(local_port) {
  if (remote_port <= 0 || local_port <= 0) return;
  // the request thread's own connection (server/http_transport.h), without a scan of every descriptor
  if (const int cur = HttpServer::current_socket(); cur >= 0 && matches(cur, &remote_addr, remote_port, local_port)) {
    fd_ = cur;
    return;
  }
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (matches(static_cast<int>(fd), &remote_addr, remote_port, local_port)) {
      fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(d);
}

bool ConnectionMonitor::still_same_socket() const { return matches(fd_, nullptr, remote_port_, local_port_); }

bool ConnectionMonitor::closed() {
  if (closed_ || fd_ < 0) return closed_;
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  int n = poll(&p, 1, 0);
  if (n < 0) return false;
  if (n > 0) {
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
      closed_ = true;
    } else if (p.revents & POLLIN) {
      char c;
      ssize_t r = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) closed_ = true;
    }
  }
  // The fd was closed and reused by another connection: ours is gone.
  if (!closed_ && !still_same_socket()) closed_ = true;
  return closed_;
}

}  // namespace dsv4
