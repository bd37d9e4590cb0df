/* The H2M interface (h2m_init, h2m_alloc_w_traits, h2m_update_traits, h2m_apply_migration,
 * h2m_free, trait keys and values as the PPAM'22 slides give them) from tiermem: a program
 * written against H2M's published API includes this header and links with
 * $(pkg-config --libs tiermem). The declarations are generated into tiermem.h from
 * crates/tiermem-capi/src/h2m; docs/capi.md describes them. */
#ifndef H2M_H
#define H2M_H
#include "tiermem.h"
#endif
