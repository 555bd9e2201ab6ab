/* quote.h: a string written as data into the languages cedar generates.
 *
 * Every name or path that reaches a gnuplot script (cli/cmd_report.c,
 * cli/cmd_explore.c) goes through cedar_quote_gnuplot, and every one that
 * reaches a generated YAML file (explore's variant plans) through
 * cedar_quote_yaml, so a hostile plan name such as
 * `x'; system 'touch PWNED'; print '` stays one string literal and a name
 * with `:` or a newline stays one scalar. HTML has its own escaper
 * (viz_html_text), JSON is written by cJSON.
 *
 * Not here: deciding whether a name is acceptable (plans accept any string).
 * Tested by tests/test_quote.c and tests/cli/hostile_names.sh.
 */
#ifndef CEDAR_QUOTE_H
#define CEDAR_QUOTE_H

#include <stddef.h>
#include <stdio.h>

/* Write s as one gnuplot single-quoted string literal, quotes included. In
 * such a literal gnuplot expands nothing (no backquote commands, no @
 * macros, no backslash escapes); a quote is doubled. A control byte (a
 * newline would end the command) is written as a space: a title is one
 * line. */
void cedar_quote_gnuplot(FILE *f, const char *s);

/* Write s as one YAML double-quoted scalar, quotes included: `"` and `\`
 * escaped, a newline, tab or carriage return as \n \t \r, any other control
 * byte as \xNN. Bytes from 0x80 up pass as they are (YAML is UTF-8; the
 * reader checks the encoding). */
void cedar_quote_yaml(FILE *f, const char *s);

/* The same into a buffer of cap bytes (NUL-terminated); returns the length
 * the whole quoted string needs, as snprintf does, so a result >= cap means
 * it was cut. */
size_t cedar_quote_gnuplot_buf(char *out, size_t cap, const char *s);
size_t cedar_quote_yaml_buf(char *out, size_t cap, const char *s);

#endif
