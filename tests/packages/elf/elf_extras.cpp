// Extra parts of the ELF test libraries (tests/packages/elf), each built into the toy package's
// host library by one macro, so that every library differs from a good package in one way:
//   ELF_CTOR     a constructor that does what the test asks through the environment:
//                KH_TEST_CTOR_MARKER=PATH writes getpid() to PATH first, then
//                KH_TEST_CTOR=segv|abort|hang|exit|print crashes, aborts, hangs, calls exit(0)
//                or prints to stdout; unset, it does nothing more.
//   ELF_TEXTREL  an absolute address stored in .text, which only a text relocation can fill.
//   ELF_UNIQUE   a static local of an exported inline function, which g++ makes STB_GNU_UNIQUE
//                (unless -fno-gnu-unique).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ELF_CTOR
__attribute__((constructor)) static void elf_test_constructor() {
  if (const char* marker = getenv("KH_TEST_CTOR_MARKER")) {
    if (FILE* f = fopen(marker, "w")) {
      fprintf(f, "%d\n", static_cast<int>(getpid()));
      fclose(f);
    }
  }
  const char* action = getenv("KH_TEST_CTOR");
  if (!action) return;
  if (strcmp(action, "segv") == 0) raise(SIGSEGV);
  if (strcmp(action, "abort") == 0) abort();
  if (strcmp(action, "hang") == 0)
    for (;;) pause();
  if (strcmp(action, "exit") == 0) exit(0);
  if (strcmp(action, "print") == 0) {
    printf("printed by a package constructor\n");
    fflush(stdout);
  }
}
#endif

#ifdef ELF_TEXTREL
asm(".pushsection .text\n"
    ".p2align 3\n"
    "elf_textrel_word:\n"
    ".8byte elf_textrel_word\n"
    ".popsection\n");
#endif

#ifdef ELF_UNIQUE
__attribute__((visibility("default"))) inline int& elf_unique_counter() {
  static int count = 0;
  return count;
}
extern "C" __attribute__((visibility("default"))) int elf_unique_bump() {
  return ++elf_unique_counter();
}
#endif
