/* Placeholder: being written. */
#include <stddef.h>
