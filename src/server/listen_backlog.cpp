#include "server/listen_backlog.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace dsv4 {

int raise_listen_backlog(int port, int backlog) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    struct stat st{};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage ss{};
    len = sizeof ss;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    int p = -1;
    if (ss.ss_family == AF_INET) p = ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) p = ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
    if (p == port && ::listen(int(fd), backlog) == 0) ++n;
  }
  closedir(d);
  return n;
}

}  // namespace dsv4
