/* main.c - placeholder entry of the flexdiag CLI (replaced by the command dispatcher). */
#include <stdio.h>
int main(void) { return 0; }
