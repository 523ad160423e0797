/* lvcheck: what tests/libvirt's guest check needs and busybox has no
 * applet for. Built statically on the host (tests/libvirt/run.sh) and
 * added to the test guest's initramfs.
 *
 *   lvcheck getxattr FILE NAME        prints the attribute's value
 *   lvcheck setxattr FILE NAME VALUE  sets it
 *   lvcheck hold FILE                 takes a flock and a POSIX write lock
 *                                     on FILE, prints a line saying so, and
 *                                     keeps them until killed
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/xattr.h>
#include <unistd.h>

static int fail(const char *what) {
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	return 1;
}

int main(int argc, char **argv) {
	if (argc == 4 && !strcmp(argv[1], "getxattr")) {
		char buf[256];
		ssize_t n = getxattr(argv[2], argv[3], buf, sizeof buf);
		if (n < 0) return fail("getxattr");
		printf("%.*s\n", (int)n, buf);
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "setxattr")) {
		if (setxattr(argv[2], argv[3], argv[4], strlen(argv[4]), 0)) return fail("setxattr");
		return 0;
	}
	if (argc == 3 && !strcmp(argv[1], "hold")) {
		int fd = open(argv[2], O_RDWR | O_CREAT, 0644);
		if (fd < 0) return fail("open");
		if (flock(fd, LOCK_EX | LOCK_NB)) return fail("flock");
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
		if (fcntl(fd, F_SETLK, &fl)) return fail("F_SETLK");
		printf("LIBVIRT-GUEST holding a flock and a POSIX lock on %s\n", argv[2]);
		fflush(stdout);
		for (;;) pause();
	}
	fprintf(stderr, "usage: lvcheck getxattr FILE NAME | setxattr FILE NAME VALUE | hold FILE\n");
	return 2;
}
